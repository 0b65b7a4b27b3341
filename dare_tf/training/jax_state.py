"""The JAX trainer's state: its jitted functions over explicit variable values
(`StepFunctions`: the training steps, predictions and BatchNorm's statistics,
Keras's stateless API), its checkpoints (`JaxCheckpoints`) and the scalars
`KeepBestWeights` keeps (`Scalar`). No TensorFlow."""

from __future__ import annotations

import glob
import os
import re
import threading
import time
import zipfile
from collections.abc import Callable

import jax
import jax.numpy as jnp
import keras
import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.schema import HIST_ITEMS, TARGET_CATEGORY, USER
from dare_tf.layers.embedding_tables import recorded_lookups
from dare_tf.training.checkpoints import DamagedCheckpointError, restore_newest


class Scalar:
    """A number with `assign`, read with `float` / `int` (the best metric and its
    step; a float32 variable would round the metric it is compared with)."""

    def __init__(self, value):
        self.value = value

    def assign(self, value) -> None:
        self.value = value

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)


@public("dare_tf.training")
class JaxCheckpoints:
    """`directory/ckpt-<step>.npz`: the values of a run's variables (model and
    optimizer, in order, each named by its path and checked by shape on restore)
    and a few scalars; written in the background to a temporary file that is
    fsynced, then renamed (the directory fsynced after), the newest `keep` kept.
    The temporary files a killed writer left are removed when the directory is
    opened (one writer per run: the run directory's lock); `restore_latest`
    falls back from a damaged newest checkpoint to the older one kept beside it."""

    PATTERN = re.compile(r"ckpt-(\d+)\.npz$")
    TEMPORARY = "ckpt-*.npz.tmp-*.npz"

    def __init__(self, directory: str, keep: int = 2):
        self.directory, self.keep = directory, keep
        self._writer: threading.Thread | None = None
        os.makedirs(directory, exist_ok=True)
        for leftover in glob.glob(os.path.join(directory, self.TEMPORARY)):
            os.remove(leftover)

    def _steps(self) -> list[int]:
        found = (self.PATTERN.search(p) for p in glob.glob(os.path.join(self.directory, "ckpt-*.npz")))
        return sorted(int(m.group(1)) for m in found if m)

    def save(self, step: int, variables: list, **scalars) -> str:
        """Copies the values to the host and writes them in a thread of its own
        (training goes on meanwhile; the next `save` or `wait` waits for it)."""
        self.wait()
        path = os.path.join(self.directory, f"ckpt-{step}.npz")
        arrays = {f"v{i}": np.asarray(v.numpy()) for i, v in enumerate(variables)}
        arrays["names"] = np.array([v.path for v in variables])
        arrays.update({f"s_{k}": np.asarray(v, np.float64) for k, v in scalars.items()})
        self._writer = threading.Thread(target=self._write, args=(path, arrays), daemon=False)
        self._writer.start()
        return path

    def _write(self, path: str, arrays: dict) -> None:
        tmp = f"{path}.tmp-{os.getpid()}.npz"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        for old in self._steps()[: -self.keep]:
            os.remove(os.path.join(self.directory, f"ckpt-{old}.npz"))

    def wait(self) -> None:
        """Until the last checkpoint is on disk."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    @staticmethod
    def read(path: str) -> tuple[list[str], list[np.ndarray], dict]:
        """A checkpoint's variable names, values and scalars; `DamagedCheckpointError`
        (one line naming the file) where it cannot be read whole."""
        if not zipfile.is_zipfile(path):  # (cut short, empty, other bytes: numpy's own errors would not say so)
            raise DamagedCheckpointError(f"{path}: not a readable checkpoint (not an .npz archive: "
                                         f"{os.path.getsize(path)} bytes)")
        try:
            with np.load(path, allow_pickle=False) as data:
                names = [str(n) for n in data["names"]]
                values = [data[f"v{i}"] for i in range(len(names))]
                scalars = {k[2:]: data[k].item() for k in data.files if k.startswith("s_")}
        except Exception as e:  # noqa: BLE001 (a damaged member, a missing key: the file is damaged alike)
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DamagedCheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {reason})") from e
        return names, values, scalars

    def restore(self, path: str, variables: list) -> dict:
        """Assigns the checkpoint's values to `variables` (none of them unless every
        value reads and fits); returns its scalars."""
        names, values, scalars = self.read(path)
        if len(names) != len(variables):
            raise ValueError(f"{path}: holds {len(names)} variables; the run's model and optimizer have "
                             f"{len(variables)}: it is another model's checkpoint")
        for name, value, variable in zip(names, values, variables, strict=True):
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(f"{path}: variable {name} has shape {value.shape}; the run's "
                                 f"{variable.path} has {tuple(variable.shape)}")
        for value, variable in zip(values, variables, strict=True):
            variable.assign(value)
        return scalars

    def restore_latest(self, variables: list, say: Callable[[str], None]) -> dict | None:
        """The newest readable checkpoint's scalars, its values assigned (`restore_newest`)."""
        paths = [os.path.join(self.directory, f"ckpt-{s}.npz") for s in reversed(self._steps())]
        return restore_newest(paths, lambda path: self.restore(path, variables), say)


@public("dare_tf.training")
class StepFunctions:
    """A model's jitted functions on JAX over one explicit state (`state`: the
    trainable, non-trainable and optimizer variables' values), each batch
    assembled on the devices from a `DeviceSplit`:

    - `train(rows)`: `len(rows)` training steps (a `lax.scan`; rows `[S, B]`
      example indices of the train split), Keras's `compute_loss_and_updates`
      and the optimizer's `stateless_apply`, the state donated; returns the
      steps' losses (on the devices, not waited for);
    - `predict(split, batch, training)`: the split's outputs, every batch full
      (the last padded with example 0, its outputs dropped);
    - `refresh_batch_norm(rows)`: each BatchNorm layer's moving statistics set
      to the mean of its input's per-batch moments over the batches `rows`.

    `load()` takes the state from the model's variables, `sync()` writes it back
    (before anything reads the variables: callbacks, saving)."""

    def __init__(self, model, train_split, placement, lazy: bool = False):
        self.model, self.train_split, self.placement, self.lazy = model, train_split, placement, lazy
        self._jitted: dict = {}
        self.state = None
        self.compile_seconds: dict[str, float] = {}  # each function's first call, compiling included

    def variables(self) -> list:
        model = self.model
        return [*model.trainable_variables, *model.non_trainable_variables, *model.optimizer.variables]

    def load(self) -> None:
        m = self.model
        self.state = ([v.value for v in m.trainable_variables], [v.value for v in m.non_trainable_variables],
                      [v.value for v in m.optimizer.variables])

    def sync(self) -> None:
        for variable, value in zip(self.variables(), [x for part in self.state for x in part], strict=True):
            variable.assign(value)

    def _train_function(self):
        model, split = self.model, self.train_split
        metrics = [v.value for v in model.metrics_variables]

        lazy = self._lazy_slots() if self.lazy else None

        def loss(trainable, non_trainable, optimizer, features, labels):
            with recorded_lookups() as looked:
                value, aux = model.compute_loss_and_updates(trainable, non_trainable, metrics, features, labels,
                                                            None, training=True, optimizer_variables=optimizer)
            return value, (aux, looked)

        def steps(state, arrays, rows):
            def step(state, rows):
                trainable, non_trainable, optimizer = state
                features, labels = split.assemble(arrays, rows)
                (_, ((loss_value, _, new_non_trainable, _), looked)), grads = jax.value_and_grad(
                    loss, has_aux=True)(trainable, non_trainable, optimizer, features, labels)
                new_trainable, new_optimizer = model.optimizer.stateless_apply(optimizer, grads, trainable)
                if lazy is not None:
                    new_trainable, new_optimizer = _lazy_adam(lazy, looked, trainable, optimizer, new_trainable,
                                                              new_optimizer)
                return (new_trainable, new_non_trainable, new_optimizer), loss_value

            return jax.lax.scan(step, state, rows)

        return jax.jit(steps, donate_argnums=0, **self.placement.jit_shardings(self.state))

    def _lazy_slots(self) -> dict[str, tuple[int, int, int]]:
        """Lazy Adam: each table's path -> its index among the trainable variables and
        its first and second moments' among the optimizer's."""
        model, optimizer = self.model, self.model.optimizer
        position = {id(v): i for i, v in enumerate(optimizer.variables)}
        slots = {}
        for i, variable in enumerate(model.trainable_variables):
            if variable.path.endswith("_embedding"):
                k = optimizer._get_variable_index(variable)
                slots[variable.path] = (i, position[id(optimizer._momentums[k])],
                                        position[id(optimizer._velocities[k])])
        return slots

    def _call(self, name: str, *args):
        """The jitted function `name` on `args`; its first call is timed, to its end."""
        if name in self.compile_seconds:
            return self._jitted[name](*args)
        started = time.perf_counter()
        out = jax.block_until_ready(self._jitted[name](*args))
        self.compile_seconds[name] = time.perf_counter() - started
        return out

    def train(self, rows: np.ndarray):
        rows = np.asarray(rows, np.int32)
        name = f"train/{len(rows)}"
        if name not in self._jitted:
            self._jitted[name] = self._train_function()
        self.state, losses = self._call(name, self.state, self.train_split.arrays, self.placement.rows(rows))
        return losses

    def _forward(self, state, features, training: bool):
        model = self.model
        trainable, non_trainable, _ = state
        mapping = [*zip(model.trainable_variables, trainable), *zip(model.non_trainable_variables, non_trainable)]
        with keras.StatelessScope(state_mapping=mapping):
            return model.forward(features, training=training)

    def predict(self, split, batch: int, training: bool = False) -> dict[str, np.ndarray]:
        key = f"predict/{id(split)}/{training}"
        if key not in self._jitted:
            def outputs(state, arrays, rows):
                features, labels = split.assemble(arrays, rows)
                return {"probabilities": self._forward(state, features, training)["probability"], "labels": labels,
                        "users": features[USER], "categories": features[TARGET_CATEGORY],
                        "history_length": jnp.sum(features[HIST_ITEMS] > 0, axis=1)}
            self._jitted[key] = jax.jit(outputs)
        count = split.count // batch * batch if training else split.count
        if count == 0:
            raise ValueError(f"the split has {split.count} examples, no complete batch of {batch}")
        order = np.zeros(-(-count // batch) * batch, np.int32)
        order[:count] = np.arange(count)
        parts = [self._call(key, self.state, split.arrays, self.placement.batch(rows))
                 for rows in order.reshape(-1, batch)]
        return {k: np.concatenate([self.placement.host(p[k]) for p in parts])[:count] for k in parts[0]}

    def refresh_batch_norm(self, rows: np.ndarray) -> None:
        model, split = self.model, self.train_split
        norms = model.batch_norm_layers()
        if "moments" not in self._jitted:
            def moments(state, arrays, rows):
                features, _ = split.assemble(arrays, rows)
                out = self._forward(state, features, False)
                return {k: (jnp.mean(out[k].astype("float32"), 0), jnp.var(out[k].astype("float32"), 0))
                        for k in norms}
            self._jitted["moments"] = jax.jit(moments)
        sums = None
        for batch in rows:
            got = jax.tree.map(self.placement.host, self._call("moments", self.state, split.arrays,
                                                               self.placement.batch(batch)))
            sums = got if sums is None else jax.tree.map(np.add, sums, got)
        if sums is None:
            return
        self.sync()
        for name, (mean, variance) in sums.items():
            norms[name].moving_mean.assign(mean / len(rows))
            norms[name].moving_variance.assign(variance / len(rows))
        self.load()


def _lazy_adam(slots: dict, looked: list, trainable: list, optimizer: list, new_trainable: list,
               new_optimizer: list) -> tuple[list, list]:
    """Adam's step kept only for the table rows the step read (`looked`, from
    `recorded_lookups`): every other row of a table keeps its weights and both its
    moments, as TensorFlow's `LazyAdam` leaves the rows a sparse gradient does not
    name. (Adam is elementwise: a row it updates is the same in the dense step.)"""
    new_trainable, new_optimizer = list(new_trainable), list(new_optimizer)
    read: dict[str, list] = {}
    for path, ids in looked:
        read.setdefault(path, []).append(jnp.reshape(ids, (-1,)))
    for path, (i, m, v) in slots.items():
        rows = trainable[i].shape[0]
        touched = jnp.zeros((rows,), bool)
        if path in read:
            touched = touched.at[jnp.concatenate(read[path])].set(True, mode="drop")
        touched = touched.reshape((rows,) + (1,) * (trainable[i].ndim - 1))
        new_trainable[i] = jnp.where(touched, new_trainable[i], trainable[i])
        for j in (m, v):
            new_optimizer[j] = jnp.where(touched, new_optimizer[j], optimizer[j])
    return new_trainable, new_optimizer


__all__ = ["JaxCheckpoints", "Scalar", "StepFunctions"]
