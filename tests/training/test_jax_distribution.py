"""dare_tf.training.jax_distribution: the trainer on JAX over 4 simulated CPU
devices (`XLA_FLAGS=--xla_force_host_platform_device_count=4`): data parallel
(`keras.distribution.DataParallel`) and the item and category tables sharded
along the vocabulary (`ModelParallel` on a 2 x 2 mesh: the batch over one axis, the
tables over the other; a 1 x 4 mesh measured the same, 1/4 of the bytes a device) follow the
one-device run's losses step for step (10 steps) and predict the same probabilities, and
each device holds its share of the tables' bytes (measured from its shards);
the configurations JAX does not run are refused in one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO

pytest.importorskip("jax")

# 10 steps of each placement, every model with the model-parallel run's tables.
SCRIPT = r"""
import json, re, sys, numpy as np, jax
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.training.config import TrainConfig, effective_model_config
from dare_tf.training.jax_distribution import TABLES, Placement, bytes_per_device, distribution_for
from dare_tf.training.jax_loop import JaxSeedRun

data, work = sys.argv[1], sys.argv[2]
spec = DatasetSpec.load(data)
out = {"devices": jax.device_count()}
memory = None
for strategy, shards in (("default", 0), ("data_parallel", 0), ("model_parallel", 2)):
    config = TrainConfig.create(preset="dare", batch_size=128, epochs=1, seeds=(0,), verbose=0, strategy=strategy,
                                model_shards=shards, steps_per_execution=5, eval_batch_size=512,
                                model_overrides={"max_len": 50})
    placement = Placement(distribution_for(config.runtime))
    # every run with the model-parallel run's tables (rounded up to a multiple of the 4 devices)
    model_config = Placement(distribution_for(config.runtime.__class__(strategy="model_parallel"))).fit_model_config(
        effective_model_config(config, spec, None))
    memory = memory or {s: InMemorySplit.load(data, s, spec, model_config.max_len) for s in ("train", "val")}
    with placement.scope():
        run = JaxSeedRun(data, f"{work}/{strategy}{shards}", config, 0, spec, model_config, memory, placement,
                         True, print)
        run.functions.load()
        order = run.training_order(0)[:10]
        losses = np.concatenate([np.asarray(run.functions.train(order[i:i + 5])) for i in range(0, 10, 5)])
        run.functions.sync()
        tables = [v for v in run.model.weights if re.search(TABLES, v.path)]
        out[f"{strategy}/{shards}"] = {"losses": losses.tolist(), "table_bytes": bytes_per_device(tables),
                         "tables_total": int(sum(np.prod(v.shape) * 4 for v in tables)),
                         "probabilities": run.predict("val")["probabilities"][:64].tolist(),
                         "placement": placement.describe()}
print(json.dumps(out))
"""
# Float sums in another order (a batch split over devices, a table over shards): measured
# 1.2e-7 relative on the losses and 2.5e-6 on the probabilities.
LOSS_RTOL, PROBABILITY_ATOL = 1e-5, 1e-4


@pytest.mark.slow
def test_data_and_model_parallel_follow_one_device(taobao, tmp_path):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run([sys.executable, "-c", SCRIPT, taobao, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["devices"] == 4
    one = runs["default/0"]
    assert one["placement"] == "one device, cpu" and list(one["table_bytes"].values()) == [one["tables_total"]]
    shares = {"data_parallel/0": 1, "model_parallel/2": 1 / 2}
    meshes = {"data_parallel/0": "DataParallel over 4 cpu devices, mesh {'batch': 4}",
              "model_parallel/2": "ModelParallel over 4 cpu devices, mesh {'batch': 2, 'model': 2}"}
    for name, share in shares.items():
        run = runs[name]
        assert run["placement"] == meshes[name]
        np.testing.assert_allclose(run["losses"], one["losses"], rtol=LOSS_RTOL, err_msg=name)
        np.testing.assert_allclose(run["probabilities"], one["probabilities"], atol=PROBABILITY_ATOL, err_msg=name)
        assert len(run["table_bytes"]) == 4
        assert all(b == run["tables_total"] * share for b in run["table_bytes"].values()), (name, run)


def test_what_jax_does_not_run_is_refused_naming_the_alternative():
    from dare_tf.training import TrainConfig
    from dare_tf.training.jax_distribution import refusal

    assert refusal(TrainConfig.create(preset="dare")) is None
    assert refusal(TrainConfig.create(preset="dare", optimizer="lazy_adam")) == (
        "--optimizer=lazy_adam updates only the rows in the batch through TensorFlow's sparse gradients; on JAX "
        "use --optimizer=adam, or train on TensorFlow (unset KERAS_BACKEND)")
    assert refusal(TrainConfig.create(preset="dare", strategy="mirrored")) == (
        "--strategy=mirrored is tf.distribute's; on JAX use --strategy=data_parallel or --strategy=model_parallel "
        "(keras.distribution, docs/gpu.md)")
    assert refusal(TrainConfig.create(preset="dare", negatives="uniform:4")).startswith(
        "a ranker trained inside its cascade (--negatives, --retrieval_run, --loss) trains on TensorFlow only")


def test_tensorflow_refuses_the_keras_distribution_strategies():
    from dare_tf.training.distribution import make_strategy

    with pytest.raises(ValueError) as e:
        make_strategy("data_parallel")
    assert str(e.value) == ("strategy=data_parallel is keras.distribution's, on JAX (KERAS_BACKEND=jax, "
                            "docs/gpu.md); on TensorFlow use --strategy=mirrored or multi_worker")
