"""Training and evaluating the retrieval stage: `train_retrieval(data_dir, output_dir, RetrievalConfig())`."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from dare_tf._faces import public
from dare_tf._files import atomic_json, require_space, variables_bytes
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.preparation.prepared import item_categories
from dare_tf.data.storage.spec import SPLITS, DatasetSpec
from dare_tf.data.storage.store import load_store
from dare_tf.retrieval.config import RetrievalConfig
from dare_tf.retrieval.candidate_files import candidates_path, write_candidates
from dare_tf.retrieval.candidates import SOURCES, CandidateMerger, Query, one_source, quota_grid, quota_key
from dare_tf.retrieval.evaluation import evaluate_sources, score_rows
from dare_tf.retrieval.model import KS, TwoTowerModel, compiled_two_tower, fit_epochs, load_retrieval_model

import tensorflow as tf  # noqa: E402  (after dare_tf.retrieval.model: tf.keras is Keras 2 then)
from dare_tf.retrieval.verdict import cascade_warnings  # noqa: E402
from dare_tf.run_directory import SEED_RESULT, RunDirectory
from dare_tf.tensorboard_events import ScalarWriters


@public("dare_tf.retrieval")
def catalogue(data_dir: str, spec: DatasetSpec, splits: dict[str, InMemorySplit]):
    """Every item id (1 .. num_items - 2) with its category as the log gave it
    (`dare_tf.data.preparation.prepared.item_categories`; for a dataset prepared before the
    item -> category map, from the examples' targets and histories)."""
    def observed():
        for f in (split.features for split in splits.values()):
            yield f["hist_items"].ravel(), f["hist_categories"].ravel()
            yield f["target_item"], f["target_category"]

    category = item_categories(data_dir, spec, observed)
    items = np.arange(1, spec.num_items - 1, dtype=np.int32)
    return items, category[items].astype(np.int32)


def positive_columns(split: InMemorySplit) -> dict:
    """The example columns (`uid`, `position`, `target_item`, ...) of a split's positives."""
    keep = split.labels > 0.5
    return {k: v[keep] for k, v in split.columns.items()}


@public("dare_tf.retrieval")
def positives(split: InMemorySplit) -> dict:
    """The positive examples of a split: the histories and the items clicked next."""
    columns = positive_columns(split)  # (the positives' windows only: not every example's)
    histories = split.store.histories(columns, split.max_len)
    return {"hist_items": histories["hist_items"], "hist_categories": histories["hist_categories"],
            "target_item": columns["target_item"].astype(np.int32),
            "target_category": columns["target_category"].astype(np.int32)}


def training_batches(split: InMemorySplit, columns: dict, click_share: np.ndarray, batch_size: int, seed: int):
    """The towers' training batches: the positives `columns` in an order shuffled
    by `seed`, each batch's histories assembled from the store as the ranker's
    input assembles them (`dare_tf.data.feeding.pipeline.assemble_fn`), with each target's
    `sampling_probability` (its share of training clicks). No history is held in
    memory beyond a batch's (at 2.5M positives, 4 GB, and tf.data's copies of it)."""
    from dare_tf.data.feeding.pipeline import assemble_fn

    assemble = assemble_fn(split.store, split.max_len)
    tensors = {k: tf.constant(v) for k, v in columns.items()}
    probability = tf.constant(click_share[columns["target_item"]].astype(np.float32))

    def batch(rows):
        features, _ = assemble({k: tf.gather(v, rows) for k, v in tensors.items()})
        return {**{k: features[k] for k in ("hist_items", "hist_categories", "target_item", "target_category")},
                "sampling_probability": tf.gather(probability, rows)}

    count = len(columns["target_item"])
    return (tf.data.Dataset.range(count).shuffle(count, seed=seed).batch(batch_size)
            .map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True))


@public("dare_tf.retrieval")
def popularity_recall(train: dict, test: dict, ks=KS) -> dict:
    """The most-clicked training targets as the top-k for everybody, seen items
    included: recall on the test positives."""
    counts = np.bincount(train["target_item"])
    ranking = np.argsort(-counts, kind="stable")
    ranking = ranking[counts[ranking] > 0]
    return {f"recall@{k}": float(np.isin(test["target_item"], ranking[:k]).mean()) for k in ks}


def at_most(examples: dict, count: int, seed: int = 0) -> dict:
    """`examples` (columns of equal length), or a sample of `count` of them in their
    order, drawn once from `seed`."""
    total = len(next(iter(examples.values())))
    if total <= count:
        return examples
    keep = np.sort(np.random.default_rng(seed).choice(total, count, replace=False))
    return {k: v[keep] for k, v in examples.items()}


def candidate_merger(spec: DatasetSpec, catalogue_, train: dict) -> CandidateMerger:
    """The merger of the candidate sources over the catalogue, with the training
    split's clicks (`dare_tf.retrieval.candidates`)."""
    items, categories = catalogue_
    clicks = np.bincount(train["target_item"], minlength=spec.num_items)[items]
    return CandidateMerger(categories, clicks, spec.num_categories, depth=max(KS) + spec.max_len)


def tower_scores(model: TwoTowerModel, catalogue_):
    """`(hist_items, hist_categories) -> [B, C]` scores of the query tower against
    every catalogue slot's candidate vector."""
    items, categories = catalogue_
    vectors = model.candidate((tf.constant(items), tf.constant(categories)))
    return lambda hist_items, hist_categories: tf.matmul(
        model.query({"hist_items": hist_items, "hist_categories": hist_categories}), vectors, transpose_b=True)


def evaluate_candidates(model, merger, catalogue_, val: dict, test: dict, include_seen: bool,
                        recent_floor: float = 0.0) -> dict:
    """Chooses the sources' quotas on the validation positives (highest recall at
    the largest K, among those that give `recent_categories` at least
    `recent_floor`) and reports the test positives' recall@K of the merged list
    (`test`) and of each source alone (`test_sources`)."""
    scores = tower_scores(model, catalogue_)
    choices = [q for q in quota_grid() if q["recent_categories"] >= recent_floor]
    on_val = evaluate_sources(merger, scores, val, choices, KS, include_seen)
    top = f"recall@{max(KS)}"
    quotas = max(choices, key=lambda q: on_val[quota_key(q)][top])  # (ties: the first, a single source)
    singles = {name: one_source(name) for name in SOURCES}
    on_test = evaluate_sources(merger, scores, test, [quotas, *singles.values()], KS, include_seen)
    return {"test": on_test[quota_key(quotas)],
            "test_sources": {name: on_test[quota_key(q)] for name, q in singles.items()},
            "quotas": quotas, "val": on_val[quota_key(quotas)]}


@public("dare_tf.retrieval")
def train_retrieval(data_dir: str, output_dir: str, config: RetrievalConfig = RetrievalConfig(),
                    overwrite: bool = False, flags_text: str | None = None) -> dict:
    """Trains one two-tower model per seed on the training split's positives
    (resuming from per-epoch checkpoints) and writes `output_dir/results.json`:
    `test`, recall@10/50/100/200 on the test positives of the merged candidates
    (`dare_tf.retrieval.candidates`: the tower, most-popular and the popular
    items of the user's recent categories, with the `quotas` chosen on the
    validation positives; already-clicked items excluded unless
    `config.include_seen`), mean over seeds; `test_std`; `test_sources`, each
    source alone; `test_popularity` (= `test_sources["popularity"]`); `quotas`
    (the first seed's, which the cascade and the export use); `warnings` (a source
    the quotas leave out, a tower below a heuristic source: `cascade_warnings`);
    `per_seed`. `flags_text`, the program's flags, goes to `output_dir/flags.txt`."""
    spec = DatasetSpec.load(data_dir)
    identity = {"retrieval_config": dict(dataclasses.asdict(config), seeds=list(config.seeds)),
                "dataset": {"name": spec.dataset, "fingerprint": spec.fingerprint()}}
    for outside in ("verbose", "cascade_candidates"):  # (they do not define the run)
        identity["retrieval_config"].pop(outside)
    run_directory = RunDirectory(output_dir)
    with run_directory.lock():  # one trainer per run directory, as trainers.train
        return _train_run(data_dir, spec, config, identity, run_directory, overwrite, flags_text)


def _train_run(data_dir, spec, config, identity, run_directory, overwrite, flags_text) -> dict:
    # (a run recorded before the floor chose its quotas without one)
    run_directory.check("retrieval", identity, overwrite, defaults={"retrieval_config.recent_floor": 0.0})
    run_directory.start("retrieval", identity, flags_text)
    splits = {s: InMemorySplit.load(data_dir, s, spec) for s in ("train", "val", "test")}
    items, categories = catalogue(data_dir, spec, splits)
    for n in config.cascade_candidates:  # (refused before training, not after it)
        require_catalogue(n, len(items), "--cascade_candidates")
    train = positive_columns(splits["train"])
    share = np.bincount(train["target_item"], minlength=spec.num_items) / max(len(train["target_item"]), 1)
    val, test = (at_most(positives(splits[s]), config.eval_positives) for s in ("val", "test"))
    merger = candidate_merger(spec, (items, categories), train)
    per_seed = [_train_seed(run_directory.seed_dir(seed), spec, config, seed,
                            lambda seed: training_batches(splits["train"], train, share, config.batch_size, seed),
                            (val, test), (items, categories), merger, share[items]) for seed in config.seeds]

    def mean(rows):
        return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}

    results = {"data_dir": os.path.abspath(data_dir), "dataset": spec.dataset, "config": identity["retrieval_config"],
               "catalogue": int(len(items)), "test_positives": int(len(test["target_item"])),
               "val_positives": int(len(val["target_item"])),
               "test": mean([r["test"] for r in per_seed]),
               "test_std": {k: float(np.std([r["test"][k] for r in per_seed])) for k in per_seed[0]["test"]},
               "test_sources": {name: mean([r["test_sources"][name] for r in per_seed]) for name in SOURCES},
               "test_popularity": mean([r["test_sources"]["popularity"] for r in per_seed]),
               "quotas": per_seed[0]["quotas"], "per_seed": per_seed}
    results["warnings"] = cascade_warnings({"quotas": results["quotas"], "sources": results["test_sources"]})
    run_directory.write_results(results)
    missing = [n for n in config.cascade_candidates if not os.path.exists(candidates_path(run_directory.path, n))]
    if missing:  # (for the rankers of its cascade, on either engine)
        stage = RetrievalStage.load(data_dir, run_directory.path)
        for n in missing:
            write_candidates(stage, load_store(data_dir, spec), run_directory.path, n)
    return results


def _train_seed(run_dir, spec, config, seed, batches, evaluation, catalogue_, merger, click_share) -> dict:
    done = os.path.join(run_dir, SEED_RESULT)
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    os.makedirs(run_dir, exist_ok=True)
    model = compiled_two_tower(spec.num_items, spec.num_categories, config.embedding_dim, config.output_dim,
                               catalogue_, config.learning_rate, seed, config.popularity_correction,
                               config.uniform_negatives, click_share)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=epoch)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(run_dir, "checkpoints"), max_to_keep=1)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)

    def save(finished):  # a killed run resumes after its last finished epoch
        require_space(manager.directory, variables_bytes(model.variables) + variables_bytes(model.optimizer.variables),
                      "a checkpoint (weights, optimizer slots)")
        epoch.assign(finished)
        manager.save(checkpoint_number=finished)

    if int(epoch.numpy()) < config.epochs:
        fit_epochs(model, batches(seed),
                   config.epochs, int(epoch.numpy()), save, os.path.join(run_dir, "tensorboard"), config.verbose)
    result = {"seed": seed, **evaluate_candidates(model, merger, catalogue_, *evaluation, config.include_seen,
                                                  config.recent_floor)}
    with ScalarWriters(os.path.join(run_dir, "tensorboard")) as writers:  # (the test recall@K, at the last step)
        writers.write("test", result["test"], int(model.optimizer.iterations.numpy()))
    require_space(run_dir, variables_bytes(model.variables), "the towers' weights")
    model.query.save_weights(os.path.join(run_dir, "query_tower"))
    model.candidate.save_weights(os.path.join(run_dir, "candidate_tower"))
    atomic_json(done, result)
    return result


def merged_candidates(model, merger: CandidateMerger, catalogue_, examples: dict, quotas: dict, n: int,
                      include_seen: bool, batch_size: int = 256) -> np.ndarray:
    """The first `n` merged candidates `[E, n]` (dense item ids, in merged order) for
    each example's history (dense `hist_items`, `hist_categories`)."""
    scores = tower_scores(model, catalogue_)
    out = []
    batch_size = score_rows(merger.size, batch_size)
    for start in range(0, len(examples["hist_items"]), batch_size):
        items = examples["hist_items"][start: start + batch_size].astype(np.int32)
        cats = examples["hist_categories"][start: start + batch_size].astype(np.int32)
        proposals = merger.proposals(Query(scores(items, cats), items, cats), n)
        out.append(merger.merge(proposals, quotas, items, n, include_seen).numpy() + 1)
    return np.concatenate(out).astype(np.int64)


def require_catalogue(n: int, items: int, flag: str) -> None:
    """Refuses `flag`=n candidates of a catalogue of fewer `items`."""
    if n > items:
        raise ValueError(f"{flag}={n} is larger than the catalogue ({items} items)")


@dataclasses.dataclass
class RetrievalStage:
    """A finished `train_retrieval` run with what it ranks, as the cascade
    evaluation, the retrieval export and a ranker's retrieval negatives use it:
    the dataset's splits, the catalogue (`items`, their `categories` as the towers
    saw them), the towers (`model`, the run's first seed), the sources' `merger`,
    the run's `quotas` and seen-items setting."""

    spec: DatasetSpec
    splits: dict
    items: np.ndarray
    categories: np.ndarray
    model: TwoTowerModel
    merger: CandidateMerger
    quotas: dict
    include_seen: bool

    @property
    def category_of(self) -> np.ndarray:
        """Every dense item id's category `[num_items]` (the catalogue's, as the log
        gave it: `dare_tf.data.preparation.prepared.item_categories`), padding and out-of-vocabulary
        rows included."""
        oov = [self.spec.oov_category]
        return np.concatenate([oov, self.categories, oov]).astype(np.int64)

    @classmethod
    def load(cls, data_dir: str, run_dir: str, label: str | None = None) -> "RetrievalStage":
        """Refuses (before loading anything) a run that is unfinished or of another dataset."""
        spec = DatasetSpec.load(data_dir)
        RunDirectory(run_dir).require("retrieval", spec.fingerprint(), label)
        splits = {s: InMemorySplit.load(data_dir, s, spec) for s in SPLITS}
        items, categories = catalogue(data_dir, spec, splits)
        recorded = RunDirectory(run_dir).results()
        return cls(spec, splits, items, categories, load_retrieval_model(run_dir, spec, items, categories),
                   candidate_merger(spec, (items, categories), positive_columns(splits["train"])),
                   recorded["quotas"],
                   recorded["config"].get("include_seen", False))

    def require_candidates(self, n: int, flag: str) -> None:
        """Refuses `flag`=n candidates when the catalogue holds fewer."""
        require_catalogue(n, len(self.items), flag)

    def candidates(self, histories: dict, n: int) -> np.ndarray:
        """The first `n` merged candidates `[P, n]` (dense ids, best first) of each
        history (dense `hist_items`, `hist_categories` `[P, L]`, oldest first)."""
        return merged_candidates(self.model, self.merger, (self.items, self.categories), histories, self.quotas, n,
                                 self.include_seen)
