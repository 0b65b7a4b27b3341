"""The trained runs an analysis reads (`load_run`) and the model outputs it computes
over in-memory examples, batch by batch (`forward`, `slot_scores`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.run_directory import RunDirectory


@dataclasses.dataclass
class Run:
    """A trained run: its label, directory, model (first seed), model config
    dict, results and per-seed histories."""

    label: str
    run_dir: str
    model: object
    results: dict
    histories: list

    @property
    def top_k(self) -> int:
        return self.model.search.kept(self.model.model_config.max_len)


def load_run(label: str, run_dir: str, spec: DatasetSpec, data_dir: str) -> Run:
    """Loads a finished `trainers.train` run, refusing one trained on another dataset."""
    run = RunDirectory(run_dir)
    model = run.trained_model(spec.fingerprint(), label)
    results = run.results()
    histories = [run.history(s) for s in results["seeds"]]
    return Run(label, run_dir, model, results, [h for h in histories if h])


def batches(arrays: dict, size: int):
    n = len(next(iter(arrays.values())))
    for start in range(0, n, size):
        yield {k: v[start: start + size] for k, v in arrays.items()}


def forward(model, arrays: dict, keys, batch: int = 2048) -> dict:
    """`model.forward` outputs `keys` over in-memory examples, as numpy."""
    from keras import ops

    from dare_tf.model.inputs import input_keys

    parts = {k: [] for k in keys}
    for x in batches({k: arrays[k] for k in input_keys(model.model_config.fields)}, batch):
        out = model.forward(x, training=False)
        for k in keys:
            parts[k].append(ops.convert_to_numpy(out[k]))
    return {k: np.concatenate(v) for k, v in parts.items()}


def slot_scores(model, arrays: dict, batch: int = 2048, items: bool = True) -> np.ndarray:
    """The model's stage-1 score of every history slot; without `items`, the
    category and time part of it (every item row zeroed, as the paper's NDCG
    ranks: `attention.category_position_scores`)."""
    from keras import ops

    from dare_tf.model.inputs import input_keys

    parts = []
    for x in batches({k: arrays[k] for k in input_keys(model.model_config.fields)}, batch):
        embedded = model.embeddings(x)
        roles = embedded.roles
        if not items:
            rows = model.embedding.lookup(*embedded.ids.lookup_args())
            roles = model.embedding.combine({k: ops.zeros_like(v) if k.endswith("/item") else v
                                             for k, v in rows.items()})
        parts.append(ops.convert_to_numpy(model.slot_scores(roles, embedded.ids)))
    return np.concatenate(parts)
