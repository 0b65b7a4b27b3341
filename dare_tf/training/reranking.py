"""A ranking run's cascade (`Cascade`): the sampler of its negatives drawn from
the retrieval stage's candidates, and the candidates of its validation and test
positives, whose reordering (`dare_tf.reranking`) the trainer reports at every
validation when it has a retrieval run."""

from __future__ import annotations

import numpy as np

from dare_tf._faces import public
from dare_tf.data.feeding.negatives import NegativeSampler
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.storage.store import load_store
from dare_tf.data.preparation.prepared import item_categories
from dare_tf.data.storage.schema import HIST_CATEGORIES, HIST_ITEMS
from dare_tf.reranking import CascadeExamples
from dare_tf.retrieval.candidate_files import read_candidates
from dare_tf.run_directory import RunDirectory


@public("dare_tf.training")
class Cascade:
    """What a ranking run needs of its cascade (`CascadeConfig`): the sampler of its
    training negatives (None: the prepared dataset's own) and the validation and
    test positives with the retrieval run's candidates (`examples`; {} without a
    retrieval run). `Cascade.load` returns None when the run uses neither."""

    def __init__(self, sampler, store, examples: dict[str, CascadeExamples]):
        self.sampler, self.store, self.examples = sampler, store, examples

    def train_split(self, seed: int, epochs: int, max_len: int):
        """The training split of one seed: `epochs` epochs of freshly drawn groups."""
        return InMemorySplit(self.sampler.epochs(seed, epochs), self.store, max_len, drawn_epochs=epochs)

    @classmethod
    def load(cls, data_dir: str, spec, config, max_len: int, partitions, memory: dict) -> "Cascade | None":
        cascade = config.cascade
        if not cascade.sources and not cascade.retrieval_run:
            return None
        if cascade.sources and "label" in {role for role, _ in spec.source.get("log", {}).get("columns", [])}:
            raise ValueError(f"--negatives={cascade.negatives}: {data_dir} comes from an impression log, whose "
                             "labelled impressions are the negatives; draw negatives for click logs only")
        if cascade.sources and "train" not in memory:
            raise ValueError(f"--negatives={cascade.negatives} draws each epoch's negatives in memory, but the "
                             f"train split of {data_dir} is larger than --in_memory_mb={config.data.in_memory_mb}; "
                             "raise it (20 bytes per example)")
        splits = {split: memory.get(split) or InMemorySplit.load(data_dir, split, spec, max_len, partitions)
                  for split in ("train", "val", "test")}
        positive = {s: {k: v[split.labels > 0.5] for k, v in split.columns.items() if k != "label"}
                    for s, split in splits.items()}
        store = load_store(data_dir, spec, partitions)
        category_of = item_categories(data_dir, spec, lambda: [(store.items, store.categories)] + [
            (split.columns["target_item"], split.columns["target_category"]) for split in splits.values()])
        tables = {}
        if cascade.retrieval_run:  # (the candidates the retrieval run wrote: no tensorflow-recommenders here)
            RunDirectory(cascade.retrieval_run).require("retrieval", spec.fingerprint(), "--retrieval_run")
            wanted = ["val", "test"] + (["train"] if "retrieval" in dict(cascade.sources) else [])
            tables = {s: read_candidates(cascade.retrieval_run, cascade.candidates, s, positive[s]["uid"],
                                         positive[s]["position"], "--retrieval_run") for s in wanted}
        sampler = None
        if cascade.sources:
            clicks = np.bincount(positive["train"]["target_item"], minlength=spec.num_items)
            sampler = NegativeSampler(positive["train"], cascade.sources, category_of, clicks, tables.get("train"))
        examples = {}
        for split in ("val", "test") if tables else ():
            p = positive[split]
            histories = dict(zip((HIST_ITEMS, HIST_CATEGORIES), store.windows(p["uid"], p["position"], max_len)))
            examples[split] = CascadeExamples(histories, tables[split], p["target_item"], category_of)
        return cls(sampler, store, examples)
