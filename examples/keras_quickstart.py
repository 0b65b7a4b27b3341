"""DARE as a Keras model: build a preset, fit, evaluate, predict, explain, save and load.

    python examples/keras_quickstart.py

Runs in seconds on random ids with a planted signal (the label is whether the
target's category occurs in the history), on the backend `KERAS_BACKEND` names
(TensorFlow by default; `KERAS_BACKEND=jax` works the same).
"""

import os
import tempfile

import keras
import numpy as np

import dare_tf

NUM_ITEMS, NUM_CATEGORIES, L = 500, 21, 50  # in a prepared dataset: spec.json's num_items, ...


def planted_batch(rng, n):
    item_category = rng.integers(1, NUM_CATEGORIES, NUM_ITEMS)
    hist_items = rng.integers(1, NUM_ITEMS, (n, L))
    hist_items[:, : L // 2] *= rng.random((n, 1)) < 0.5  # half of the histories left-padded with 0
    x = {"target_item": rng.integers(1, NUM_ITEMS, n), "hist_items": hist_items}
    x["target_category"] = item_category[x["target_item"]]
    x["hist_categories"] = np.where(hist_items > 0, item_category[hist_items], 0)
    y = np.array([t in h for t, h in zip(x["target_category"], x["hist_categories"])], np.float32)
    return x, y


def main():
    rng = np.random.default_rng(0)
    (x, y), (x_test, y_test) = planted_batch(rng, 8192), planted_batch(rng, 2048)
    # DARE: attention embeddings (8 wide) apart from representation embeddings (16 wide).
    model = dare_tf.build_model("dare", NUM_ITEMS, NUM_CATEGORIES, max_len=L, top_k=10, embedding_dim=16,
                                attention_embedding_dim=8, seed=0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=[keras.metrics.AUC(name="auc")])
    model.fit(x, y, batch_size=256, epochs=3, verbose=0)
    metrics = model.evaluate(x_test, y_test, batch_size=1024, return_dict=True, verbose=0)
    print(f"test loss {metrics['loss']:.4f}, AUC {metrics['auc']:.4f}")
    probabilities = model.predict(x_test, batch_size=1024, verbose=0)  # P(click) [B]
    explained = model.explain({k: v[:1] for k, v in x_test.items()})
    print(f"P(click) of the first test example: {probabilities[0]:.3f}; the search kept slots "
          f"{keras.ops.convert_to_numpy(explained['positions'])[0][:5].tolist()} ...")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dare.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
        same = np.allclose(loaded.predict(x_test, batch_size=1024, verbose=0), probabilities, atol=1e-6)
    print(f"saved and loaded: same predictions {same}")
    return metrics


if __name__ == "__main__":
    main()
