import keras
import numpy as np
import pytest
import tensorflow as tf

from dare_tf.optimizers import LazyAdam


def run(optimizer, table, batches, dense=False):
    """Applies sparse gradients (or, with dense=True, the same gradients densified:
    duplicate rows summed, as Adam's maths defines them)."""
    for ids, grads in batches:
        grad = tf.IndexedSlices(tf.constant(grads, tf.float32), tf.constant(ids),
                                dense_shape=tf.constant(table.shape))
        optimizer.apply([tf.convert_to_tensor(grad) if dense else grad], [table])
    return table.numpy()


def test_lazy_adam_matches_adam_on_touched_rows_and_leaves_others(rng):
    init = rng.normal(size=(10, 3)).astype("float32")
    batches = [(np.array([1, 3, 1]), rng.normal(size=(3, 3))), (np.array([3, 5]), rng.normal(size=(2, 3)))]
    lazy = run(LazyAdam(0.1), keras.Variable(init), batches)
    dense = run(keras.optimizers.Adam(0.1), keras.Variable(init), batches, dense=True)
    untouched = [0, 2, 4, 6, 7, 8, 9]
    np.testing.assert_array_equal(lazy[untouched], init[untouched])
    # Row 1 was touched in step 1 only: dense Adam keeps moving it in step 2.
    assert np.abs(dense[1] - lazy[1]).max() > 1e-4
    # Rows touched every step (row 3) and first-step values agree with Adam.
    np.testing.assert_allclose(lazy[3], dense[3], rtol=1e-5, atol=1e-6)
    one_step_lazy = run(LazyAdam(0.1), keras.Variable(init), batches[:1])
    one_step_dense = run(keras.optimizers.Adam(0.1), keras.Variable(init), batches[:1], dense=True)
    np.testing.assert_allclose(one_step_lazy, one_step_dense, rtol=1e-5, atol=1e-6)


def test_lazy_adam_dense_gradients_are_adam(rng):  # via FusedAdam's kernel
    init = rng.normal(size=(4, 2)).astype("float32")
    g = [tf.constant(rng.normal(size=(4, 2)), tf.float32) for _ in range(3)]
    a, b = keras.Variable(init), keras.Variable(init)
    la, da = LazyAdam(0.05), keras.optimizers.Adam(0.05)
    for grad in g:
        la.apply([grad], [a])
        da.apply([grad], [b])
    # The fused kernel orders the float operations differently: ~1e-6 apart.
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_fused_adam_equals_keras_adam(rng):
    from dare_tf.optimizers import FusedAdam

    init = rng.normal(size=(50, 4)).astype("float32")
    a, b = keras.Variable(init), keras.Variable(init)
    fused, reference = FusedAdam(0.01), keras.optimizers.Adam(0.01)
    step_a = tf.function(lambda g: fused.apply([g], [a]))
    step_b = tf.function(lambda g: reference.apply([g], [b]))
    for _ in range(5):
        grad = tf.constant(rng.normal(size=(50, 4)) * 1e-3, tf.float32)
        step_a(grad)
        step_b(grad)
    assert np.abs(a.numpy() - init).max() > 1e-3  # it moved
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def numpy_lazy_adam(init, batches, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Brute-force lazy Adam: sum duplicate rows, update moments and weights of the
    looked-up rows only."""
    w, m, v = init.astype(np.float64), np.zeros(init.shape), np.zeros(init.shape)
    for t, (ids, grads) in enumerate(batches, start=1):
        g = np.zeros(init.shape)
        np.add.at(g, ids, grads)
        rows = np.unique(ids)
        m[rows] = beta_1 * m[rows] + (1 - beta_1) * g[rows]
        v[rows] = beta_2 * v[rows] + (1 - beta_2) * g[rows] ** 2
        alpha = lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
        w[rows] -= alpha * m[rows] / (np.sqrt(v[rows]) + epsilon)
    return w, m, v


@pytest.mark.parametrize("rows,entries", [(40, 6), (5, 12)], ids=["row-path", "masked-table-path"])
def test_lazy_adam_equals_numpy_lazy_adam(rng, rows, entries):
    # More table rows than entries: rows are gathered, updated and scattered back.
    # No more rows than entries: the table is updated whole under a mask.
    init = rng.normal(size=(rows, 3)).astype("float32")
    # Each step looks up a different window of rows: rows looked up earlier but not
    # now must stay put (dense Adam would move them), and the last row never moves.
    width = max(2, (rows - 1) // 2)
    batches = []
    for t in range(4):
        window = (np.arange(width) + t) % (rows - 1)
        batches.append((rng.choice(window, entries), rng.normal(size=(entries, 3))))
    assert any(len(np.unique(ids)) < entries for ids, _ in batches)  # duplicates occur
    assert set(batches[0][0]) - set(batches[-1][0])  # rows left behind
    table = keras.Variable(init)
    optimizer = LazyAdam(0.05)
    optimizer.build([table])
    step = tf.function(lambda ids, g: optimizer.apply(
        [tf.IndexedSlices(g, ids, dense_shape=tf.constant(init.shape))], [table]))
    for ids, grads in batches:
        step(tf.constant(ids, tf.int32), tf.constant(grads, tf.float32))
    w, m, v = numpy_lazy_adam(init, batches, 0.05)
    np.testing.assert_allclose(table.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(optimizer._momentums[0].numpy(), m, rtol=1e-5, atol=1e-7)
    # 1 - beta_2 = 0.001 is 4.7e-5 off in float32 (as in Keras's Adam).
    np.testing.assert_allclose(optimizer._velocities[0].numpy(), v, rtol=1e-4, atol=1e-9)
    never = np.setdiff1d(np.arange(rows), np.concatenate([ids for ids, _ in batches]))
    assert len(never) > 0
    np.testing.assert_array_equal(table.numpy()[never], init[never])


def test_embedding_lookup_gives_sparse_gradients(rng):
    from dare_tf.layers import BehaviorEmbedding

    layer = BehaviorEmbedding(7, 5, embedding_dim=2, position_dim=2, num_positions=8, coupling="shared")
    ids = np.array([[3, 0, 3], [6, 1, 2]])
    with tf.GradientTape() as tape:
        out = layer(np.array([1, 2]), np.array([1, 1]), ids, np.ones_like(ids))
        loss = tf.reduce_sum(out["history_representation"] ** 2)
    table = layer.tables["shared"]["item"]
    grad = tape.gradient(loss, table.value)
    assert isinstance(grad, tf.IndexedSlices)
    init = table.numpy()
    expected = np.zeros_like(init)
    np.add.at(expected, ids.ravel(), 2 * init[ids.ravel()])
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), expected, rtol=1e-6)


def test_fused_adam_sparse_gradients_equal_dense_adam(rng):
    from dare_tf.optimizers import FusedAdam

    init = rng.normal(size=(12, 3)).astype("float32")
    batches = [(np.array([1, 3, 1]), rng.normal(size=(3, 3))), (np.array([3, 5]), rng.normal(size=(2, 3)))]
    fused = run(FusedAdam(0.1), keras.Variable(init), batches)
    dense = run(keras.optimizers.Adam(0.1), keras.Variable(init), batches, dense=True)
    np.testing.assert_allclose(fused, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit_compile_dense", [True, False])
def test_lazy_adam_training_touches_only_looked_up_rows(rng, jit_compile_dense):
    import dare_tf
    from dare_tf.optimizers import make_optimizer
    from tests.conftest import random_batch

    # Item (1,000 rows) and position (2,000 rows) tables have more rows than the
    # 32 x 13 looked-up entries: the row path; category tables (20 rows): the masked path.
    model = dare_tf.build_model("dare", 1000, 20, max_len=12, top_k=4, seed=0,
                                jit_compile_dense=jit_compile_dense)
    x = {k: tf.constant(v, tf.int32) for k, v in random_batch(rng, 32, 12, 100, 20).items()}
    y = tf.constant(rng.integers(0, 2, 32), tf.float32)
    tables = {t.path: t for t in model.trainable_variables if "_embedding" in t.path}
    before = {p: t.numpy() for p, t in tables.items()}
    model.compile(optimizer=make_optimizer("lazy_adam", 0.01))
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    ids = {"item": np.concatenate([x["target_item"].numpy(), x["hist_items"].numpy().ravel()]),
           "category": np.concatenate([x["target_category"].numpy(), x["hist_categories"].numpy().ravel()]),
           "position": np.arange(13)}  # the target's 0 and history slots' 1..12
    assert len(tables) == 6
    for path, table in tables.items():
        field = path.split("_")[-2]
        seen = np.unique(ids[field])
        unseen = np.setdiff1d(np.arange(table.shape[0]), seen)
        after = table.numpy()
        np.testing.assert_array_equal(after[unseen], before[path][unseen], err_msg=path)
        assert np.abs(after[seen] - before[path][seen]).max() > 1e-4, path


def test_the_optimizer_module_owns_its_names_and_each_class_its_gradient_mode():
    import subprocess
    import sys

    from dare_tf.optimizers import OPTIMIZERS, FusedAdam, LazyAdam, make_optimizer
    from dare_tf.training import TrainConfig

    assert {name: type(make_optimizer(name, 0.1)) for name in OPTIMIZERS} == {"adam": FusedAdam,
                                                                             "lazy_adam": LazyAdam}
    assert (FusedAdam.sparse_gradients, LazyAdam.sparse_gradients) == (False, True)
    with pytest.raises(ValueError, match=r"^optimizer='sgd': expected one of \('adam', 'lazy_adam'\)$"):
        make_optimizer("sgd", 0.1)
    with pytest.raises(ValueError, match=r"^optimizer='sgd': must be one of \('adam', 'lazy_adam'\)$"):
        TrainConfig.create(optimizer="sgd")
    # The names cost no TensorFlow (the programs' flags read them before it loads).
    loaded = subprocess.run([sys.executable, "-c", "import sys, dare_tf.optimizers as o; o.OPTIMIZERS; "
                             "print('tensorflow' in sys.modules, 'keras' in sys.modules)"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert loaded == ["False", "False"]


# Issue 66 (2): `--optimizer=lazy_adam` on JAX: the JAX trainer's steps (`StepFunctions`, lazy)
# from the same weights on the same batches as TensorFlow's `LazyAdam` (`train_on_batch`).
JAX_STEPS = r"""
import json, sys, numpy as np, keras
from dare_tf.model.config import ModelConfig
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.model.dare_model import DareModel
from dare_tf.model.tasks import ClickTask
from dare_tf.training.engines.jax.device_input import DeviceSplit
from dare_tf.training.engines.jax.distribution import Placement
from dare_tf.training.engines.jax.state import StepFunctions
data, work = sys.argv[1], sys.argv[2]
cfg = ModelConfig.from_dict(json.load(open(work + "/config.json")))
rows = np.load(work + "/rows.npy")
split = InMemorySplit.load(data, "train", max_len=cfg.max_len)
placement = Placement(None)
for kind in ("lazy", "dense"):  # (one process: a JAX start-up costs more than the steps)
    model = DareModel(cfg, seed=0, name="dare")
    model.task = ClickTask()
    model.build()
    model.load_weights(work + "/initial.weights.h5")
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    model.optimizer.build(model.trainable_variables)
    functions = StepFunctions(model, DeviceSplit(split, placement.replicate), placement, lazy=kind == "lazy")
    functions.load()
    functions.train(rows)
    functions.sync()
    np.savez(work + f"/jax_{kind}.npz", **{v.path: v.numpy() for v in model.trainable_variables})
"""


@pytest.mark.slow
def test_lazy_adam_on_jax_takes_tensorflows_steps(taobao, tmp_path):
    """Five steps of DARE from the same weights on the same batches: the JAX trainer's lazy Adam
    ends within 2e-5 of TensorFlow's LazyAdam on every table and 5e-4 on the dense layers,
    leaving the table rows no batch read exactly as they were, and unlike JAX's dense Adam, which
    keeps moving a row read in an earlier step."""
    import json
    import os
    import subprocess
    import sys

    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.model.dare_model import DareModel
    from dare_tf.model.tasks import ClickTask
    from dare_tf.training import TrainConfig, effective_model_config
    from tests.conftest import REPO

    config = TrainConfig.create(preset="dare", model_overrides=dict(max_len=20, embedding_dim=8,
                                                                    attention_embedding_dim=4, top_k=5))
    cfg = effective_model_config(config, DatasetSpec.load(taobao), None)
    rows = np.random.default_rng(0).permutation(4096)[:5 * 64].reshape(5, 64).astype(np.int32)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    np.save(tmp_path / "rows.npy", rows)
    keras.utils.set_random_seed(0)
    model = DareModel(cfg, seed=0, sparse_embedding_gradients=True, name="dare")
    model.task = ClickTask()
    model.build()
    model.save_weights(str(tmp_path / "initial.weights.h5"))
    initial = {v.path: v.numpy() for v in model.trainable_variables}
    model.compile(optimizer=LazyAdam(0.01))
    split = InMemorySplit.load(taobao, "train", max_len=cfg.max_len)
    for batch in rows:
        x, y = next(split.host_batches(batch, len(batch)))
        model.train_on_batch(x, y)
    tensorflow = {v.path: v.numpy() for v in model.trainable_variables}
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-c", JAX_STEPS, taobao, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lazy, dense = np.load(tmp_path / "jax_lazy.npz"), np.load(tmp_path / "jax_dense.npz")
    assert sorted(lazy.files) == sorted(tensorflow)
    for path, value in tensorflow.items():  # (Adam's step on a near-zero gradient turns float noise into
        # steps of up to the learning rate: the dense layers measured 1e-4 apart; the tables, 2e-6)
        np.testing.assert_allclose(lazy[path], value, atol=2e-5 if path.endswith("_embedding") else 5e-4,
                                   err_msg=path)
    table = next(p for p in tensorflow if p.endswith("representation_item_embedding"))
    unread = np.all(tensorflow[table] == initial[table], axis=1)
    assert 0 < unread.sum() < len(unread) - 100  # (rows the batches read moved; the others did not)
    np.testing.assert_array_equal(lazy[table][unread], initial[table][unread])
    # Dense Adam keeps moving a row read in an earlier step (its momentum); lazy Adam does not.
    assert np.abs(dense[table] - lazy[table]).max() > 1e-3
