"""The JAX trainer's state: its jitted functions over explicit variable values
(`StepFunctions`: the training steps, predictions and BatchNorm's statistics,
Keras's stateless API) and the scalars
`KeepBestWeights` keeps (`Scalar`). No TensorFlow."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import keras
import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.schema import HIST_ITEMS, TARGET_CATEGORY, USER
from dare_tf.layers.embedding_tables import recorded_lookups


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
class StepFunctions:
    """A model's jitted functions on JAX over one explicit state (`state`: the
    trainable, non-trainable and optimizer variables' values), each batch
    assembled on the devices from a `DeviceSplit`:

    - `train(rows, split)`: `len(rows)` training steps (a `lax.scan`; rows `[S, B]`
      example indices of the train split), Keras's `compute_loss_and_updates`
      and the optimizer's `stateless_apply`, the state donated; returns the
      steps' losses (on the devices, not waited for);
    - `predict(split, batch, training)`: the split's outputs, every batch full
      (the last padded with example 0, its outputs dropped);
    - `refresh_batch_norm(rows, split)`: each BatchNorm layer's moving statistics set
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
            return value, (aux, looked if lazy is not None else [])  # (the ids only where lazy Adam reads them)

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

    def train(self, rows: np.ndarray, split=None):
        """`len(rows)` steps on the examples `rows` of the train split, or of `split`
        (a streamed split's chunk, on the same store)."""
        rows = np.asarray(rows, np.int32)
        name = f"train/{len(rows)}"
        if name not in self._jitted:
            self._jitted[name] = self._train_function()
        arrays = (split or self.train_split).arrays
        self.state, losses = self._call(name, self.state, arrays, self.placement.rows(rows))
        return losses

    def _forward(self, state, features, training: bool):
        model = self.model
        trainable, non_trainable, _ = state
        mapping = [*zip(model.trainable_variables, trainable), *zip(model.non_trainable_variables, non_trainable)]
        with keras.StatelessScope(state_mapping=mapping):
            return model.forward(features, training=training)

    def predict(self, split, batch: int, training: bool = False) -> dict[str, np.ndarray]:
        key = f"predict/{id(split.store_arrays)}/{training}"  # (the splits and chunks of one store alike)
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

    def refresh_batch_norm(self, rows: np.ndarray, split=None) -> None:
        model, split = self.model, split or self.train_split
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


__all__ = ["Scalar", "StepFunctions"]
