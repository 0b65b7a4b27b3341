"""The end-to-end demo (`make demo`, `python -m trainers.demo`), as one library call."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

from dare_tf import retrieval
from dare_tf.analysis.suite import AnalysisConfig, run_analyses
from dare_tf.data.feeding.pipeline import make_dataset
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.data.generation.synthetic import SyntheticConfig, write
from dare_tf.experiments import reproduce
from dare_tf.serving.encoding import format_recommendations
from dare_tf.serving.recommender import Recommender
from dare_tf.serving.client import ServingClient
from dare_tf.serving.encoding import explained_behaviours, format_explanation
from dare_tf.export import MODELS_CONFIG, export_run
from dare_tf.testing.model_config import read_model_config
from dare_tf.testing.standin_server import serve
from dare_tf.training import TrainConfig, format_results, train
from dare_tf.training.progress import Parts
from dare_tf.metrics import CASCADE_CANDIDATES

# The synthetic users have 20 to 1,000 clicks (median 120); users with 50 or more
# get 10 train targets 5 clicks apart, so training sees histories from 2 clicks
# to the full L.
# Trained on both datasets, compared, and analysed on the synthetic one.
ANALYSED_MODELS = ("dare", "twin", "din", "dare_no_tr")
# Part 2's runs: epochs enough for each model's validation to stop improving before its last (no
# "train longer"), and a batch that gives the small Taobao sample enough steps (no "too few steps").
DEMO_BATCH, DEMO_EPOCHS = 512, 4
SAMPLE_BATCH, SAMPLE_EPOCHS = 64, 8
# The banner's estimate: `time make demo` measured 7.6 minutes on a quiet 2-core machine with the
# real sample beside the checkout (its five parts: 2 s, 136 s, 5 s, 173 s, 133 s), rounded up.
DEMO_MINUTES = 8
SYNTHETIC_PROTOCOL = Protocol(min_clicks=50, max_len=100, train_targets=10, stride=5)
# The cascade's ranker (docs/two-stage.md): each training click against 8 catalogue items drawn
# uniformly (they teach popularity) and 8 of its own history's retrieved candidates (they teach
# the order among plausible items), drawn afresh every epoch; the weights kept at the best
# validation NDCG@10 of the reordered candidates.
CASCADE_TRAINING = dict(negatives="uniform:8,retrieval:8", batch_size=1152, eval_batch_size=4096, epochs=3,
                        learning_rate=0.002, model_overrides=dict(top_k=20, embedding_dim=16))



def _verbose() -> int:
    """The demo's trainings: a progress bar over each run's steps where a terminal is
    attached (`RunProgress`), else a line per validation (a log, a pipe)."""
    return 1 if sys.stdout.isatty() else 2

def _say(text: str) -> None:
    print(text, flush=True)


def _request_from_test_user(data_dir: str) -> dict:
    """The first test user's three test examples (the clicked item and two sampled
    ones, one history) in raw ids, and the history's length."""
    spec = DatasetSpec.load(data_dir)
    x, y = next(iter(make_dataset(data_dir, "test", 1 + spec.protocol["negatives"], shuffle=False)))
    raw = {"item": np.array([0] + [int(r) for r in read_id_map(data_dir, "item")] + [-1]),
           "category": np.array([0] + [int(r) for r in read_id_map(data_dir, "category")] + [-1])}
    history = x["hist_items"].numpy()[0]
    real = history > 0
    return {
        "user": read_id_map(data_dir, "user")[int(x["uid"].numpy()[0]) - 1],
        "labels": y.numpy(),
        "target_item": raw["item"][x["target_item"].numpy()],
        "target_category": raw["category"][x["target_category"].numpy()],
        "hist_items": raw["item"][history[real]],
        "hist_categories": raw["category"][x["hist_categories"].numpy()[0][real]],
    }


def _print_request(client: ServingClient, request: dict) -> None:
    n = len(request["target_item"])
    histories = [request["hist_items"]] * n
    out = client.explain(request["target_item"], request["target_category"], histories,
                         [request["hist_categories"]] * n)
    length = len(request["hist_items"])
    _say(f"user {request['user']}: {length} clicks of history; P(click) for the item clicked next and "
         "two sampled items (one batched gRPC request):")
    _say("| item | category | clicked | P(click) |\n|---|---|---|---|")
    for i in range(n):
        _say(f"| {request['target_item'][i]} | {request['target_category'][i]} | "
             f"{'yes' if request['labels'][i] > 0.5 else 'no'} | {out['probability'][i]:.4f} |")
    _say(f"behaviours the model retrieved for item {request['target_item'][0]} "
         f"(category {request['target_category'][0]}), by weight:")
    _say(format_explanation(explained_behaviours(out["history_index"][0], out["attention_weight"][0],
                                                 request["hist_items"], request["hist_categories"])))


def _two_stage(work_dir: str, data_dir: str, export_base: str, overwrite: bool = False) -> int:
    """Trains and serves the cascade; returns the user whose live clicks it showed."""
    retrieval_run = os.path.join(work_dir, "retrieval")
    results = retrieval.train_retrieval(data_dir, retrieval_run, retrieval.RetrievalConfig(
        epochs=3, cascade_candidates=(CASCADE_CANDIDATES,)))  # (the ranker's --retrieval_candidates)
    sources = results["test_sources"]
    _say("retrieval recall on the test positives (merged candidates / two-tower / most popular / recent "
         "categories): " + ", ".join(
             f"@{k.split('@')[1]} {results['test'][k]:.3f} / {sources['two_tower'][k]:.3f} / "
             f"{sources['popularity'][k]:.3f} / {sources['recent_categories'][k]:.3f}"
             for k in sorted(results["test"], key=lambda k: int(k.split("@")[1]))))  # (K order, a reused run too)
    ranker_run = os.path.join(work_dir, "cascade_ranker")
    _say("the cascade's ranker: DARE trained against uniform items and each training history's own retrieved "
         f"candidates (trainers.train --negatives={CASCADE_TRAINING['negatives']} --retrieval_run=...)")
    train(data_dir, ranker_run, TrainConfig.create(preset="dare", retrieval_run=retrieval_run, verbose=_verbose(),
                                                   **CASCADE_TRAINING), overwrite=overwrite, report=_say)
    paper = {f"{m}, paper's training": os.path.join(work_dir, "synthetic", "d16", m) for m in ("dare", "twin", "din")}
    retrieval.evaluate_cascade(data_dir, retrieval_run, {"dare, cascade negatives": ranker_run, **paper},
                               os.path.join(work_dir, "cascade"), report=_say, overwrite=overwrite, baselines=paper)
    _say("(\"paper's training\": the runs of part 2, trained against random items only, never against the "
         "plausible candidates retrieval hands a ranker, so they need not beat retrieval's own order; the cascade "
         "ranker is trained for it: docs/two-stage.md)")
    export_run(ranker_run, export_base, "ranker")
    export_run(retrieval_run, export_base, "retrieval")
    export_run(os.path.join(work_dir, "synthetic", "d16", "twin"), export_base, "twin")  # (for the inspect page)
    config = os.path.join(export_base, MODELS_CONFIG)
    server, port, _ = serve(read_model_config(config), 0)
    _say(f"stand-in server with every model of {config} on a free port")
    clients = [ServingClient(f"localhost:{port}", name) for name in ("retrieval", "ranker")]
    try:
        request = _request_from_test_user(data_dir)
        clicked = request["target_item"][request["labels"] > 0.5][0]
        result = Recommender(*clients).recommend(request["hist_items"], request["hist_categories"], n=200, top=10,
                                                 explain=True)
        _say(f"user {request['user']} ({len(request['hist_items'])} clicks; clicked next: item {clicked}): "
             "the top 10 of 200 retrieved items by the cascade ranker's click probability (two gRPC requests):")
        _say(format_recommendations(result, request["hist_items"], request["hist_categories"]))
        _live_clicks(work_dir, data_dir, clients, request, clicked)
        return int(request["user"])
    finally:
        for client in clients:
            client.close()
        server.stop(0)


def _live_clicks(work_dir: str, data_dir: str, clients, request: dict, clicked_next) -> None:
    """The history service: the users' histories in an LMDB store, recommendations by
    user id, and a click appended between two of them."""
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import load_prepared

    url, user = f"lmdb:{os.path.join(work_dir, 'histories')}", int(request["user"])
    with open_store(url) as store:
        if not len(store):  # (a demo run again finds them there)
            loaded = load_prepared(store, data_dir)
            _say(f"history service: {loaded.users} users' {loaded.kept} clicks loaded into {url} (python -m "
                 "serving.histories)")
        recommender = Recommender(*clients, histories=store)
        before, history = recommender.recommend_user(user, n=200, top=10)
        clicked = int(before["items"][-1])
        store.append(user, [clicked], [int(before["categories"][-1])], [int(history.times[0].max()) + 1])
        after, _ = recommender.recommend_user(user, n=200, top=10)
        held = int(store.last([user]).lengths[0]) - 1  # (before the live click)
    _say(f"user {user} by id from the store: top 10 {before['items'].tolist()}; after a live click on item "
         f"{clicked}: {after['items'].tolist()}")
    _say(f"(the store holds all {held} of the user's clicks (the ranker read the newest {int(history.lengths[0])}), "
         f"the test click on item "
         f"{clicked_next} and the clicks after it included, where the table above had the "
         f"{len(request['hist_items'])} before it; an item already in a history is not recommended again, so the "
         "two lists differ by what the store adds)")


def run_demo(work_dir: str, data_root: str, taobao_sample: str, synthetic_users: int = 2000,
             overwrite: bool = False) -> None:
    parts = Parts(_say)
    _say("dare-tf demo: prepares a generated log (and the real Taobao sample, where it is found), trains DARE, "
         f"TWIN, DIN and an ablation briefly (one seed, {DEMO_EPOCHS} epochs), exports and serves DARE, runs the "
         f"two-stage cascade with live clicks and the paper's analyses; about {DEMO_MINUTES} minutes on a quiet "
         "2-core machine. Deliberately short: it shows every part working; its numbers are not the paper's "
         "(docs/training.md's Table 1 grids run those).")
    parts.next("1. data")
    data_dirs, spec = _data(data_root, taobao_sample, synthetic_users)
    parts.next("2. DARE, TWIN, DIN and DARE without target-aware representation (one seed each; "
         "a validation line 5 times per run, the trainer's default schedule)")
    base = TrainConfig.create(batch_size=DEMO_BATCH, eval_batch_size=4096, epochs=DEMO_EPOCHS, learning_rate=0.005,
                              model_overrides=dict(top_k=20), verbose=_verbose())

    def config_for(model, dim, data_dir):  # (the small real sample at a smaller batch: enough steps to train)
        small = DatasetSpec.load(data_dir).counts["train"] < DEMO_BATCH * 50
        schedule = dataclasses.replace(base.schedule, batch_size=SAMPLE_BATCH, epochs=SAMPLE_EPOCHS) if small \
            else base.schedule
        return dataclasses.replace(base, preset=model, model_overrides=dict(base.model_overrides, embedding_dim=dim),
                                   schedule=schedule)
    _, cells = reproduce(data_dirs, list(ANALYSED_MODELS), [16], work_dir, config_for, overwrite=overwrite,
                         report=_say)
    run_dir = os.path.join(work_dir, "synthetic", "d16", "dare")
    with open(os.path.join(run_dir, "results.json")) as f:
        _say("DARE on the synthetic log, test metrics by history length:\n" + format_results(json.load(f)))
    parts.next("3. export and serve")
    export_base = os.path.join(work_dir, "exports")
    _export_and_serve(run_dir, export_base, data_dirs[0])
    parts.next("4. two-stage recommendation: a retrieval model (tensorflow-recommenders) picks 200 of the "
         "whole catalogue, DARE ranks them")
    user = _two_stage(work_dir, data_dirs[0], export_base, overwrite)
    parts.next("5. the paper's analyses on the synthetic runs (python -m trainers.analyze)")
    analysis_dir = _analyses(work_dir, data_dirs[0], cells, overwrite)
    parts.end()
    _say(f"outputs: tables in {work_dir}/table1.md, models in {export_base}, cascade in {work_dir}/cascade, "
         f"analyses in {analysis_dir}")
    _say("see why, in a browser: the history, the recommendations and what each one's search kept, DARE beside "
         f"TWIN (docs/inspect.md):\n  python -m serving.standin_server --model_config_file={export_base}/"
         f"{MODELS_CONFIG} --port=8500 &\n  python -m serving.inspect --server=localhost:8500 --model_name=dare "
         f"--compare=twin --histories=lmdb:{work_dir}/histories\n  then open http://127.0.0.1:8080/?user={user}")


def _data(data_root: str, taobao_sample: str, synthetic_users: int) -> tuple[list[str], DatasetSpec]:
    """The demo's generated log and (where it is) the real Taobao sample, prepared:
    their directories and the last one's spec."""
    prepared = os.path.join(data_root, "prepared")
    synthetic_log = os.path.join(data_root, "synthetic", "demo.csv")
    truth = write(SyntheticConfig(users=synthetic_users, seed=0), synthetic_log)
    data_dirs = [os.path.join(prepared, "synthetic")]
    spec = prepare("taobao", synthetic_log, data_dirs[0], SYNTHETIC_PROTOCOL)
    _say(f"synthetic log {synthetic_log}: {truth['rows']:,} rows, {spec.users} users -> {data_dirs[0]} "
         f"({spec.counts['train']:,} / {spec.counts['val']:,} / {spec.counts['test']:,} examples); "
         f"the generator's own next-click probability scores test AUC {truth['generator_auc']:.3f}")
    if os.path.exists(taobao_sample):
        data_dirs.append(os.path.join(prepared, "taobao_sample"))
        spec = prepare("taobao", taobao_sample, data_dirs[1], Protocol())
        _say(f"Taobao sample {taobao_sample}: {spec.users} users -> {data_dirs[1]} "
             f"({spec.counts['train']:,} / {spec.counts['val']:,} / {spec.counts['test']:,} examples)")
    else:
        _say(f"(skipping the real sample: {taobao_sample} not found)")
    return data_dirs, spec


def _export_and_serve(run_dir: str, export_base: str, data_dir: str) -> None:
    """Exports the DARE run, serves it on the stand-in and prints one test user's request's answer."""
    version_dir = export_run(run_dir, export_base, "dare")
    _say(f"exported {version_dir}; stand-in server (a test double of TF Serving) on a free port")
    server, port, _ = serve({"dare": os.path.dirname(version_dir)}, 0)
    client = ServingClient(f"localhost:{port}", "dare")
    try:
        _print_request(client, _request_from_test_user(data_dir))
    finally:
        client.close()
        server.stop(0)


def _analyses(work_dir: str, data_dir: str, cells, overwrite: bool) -> str:
    """The paper's analyses on the synthetic runs, summarised; returns their directory."""
    runs = {m: os.path.join(work_dir, "synthetic", "d16", m) for m in ANALYSED_MODELS}
    analysis_dir = os.path.join(work_dir, "analysis")
    result = run_analyses(data_dir, runs, analysis_dir, AnalysisConfig(attention_dims=(16, 8, 4)),
                          dimension_runs={16: runs["dare"]}, report=_say, overwrite=overwrite)
    retrieval, grads = result["retrieval"], result["gradients"]
    _say("search-stage NDCG against the MI ground truth (behaviours ranked by their mutual information with the "
         "click, the paper's relevance): " + ", ".join(
        f"{k} {v:.3f}" for k, v in retrieval["ndcg"].items()) + "; against the planted truth: " + ", ".join(
        f"{k} {v:.3f}" for k, v in retrieval["planted"]["ndcg"].items()))
    _say(f"TWIN's shared embeddings: representation/attention gradient norm ratio {grads['norm_ratio']:.2f}, "
         f"conflicting in {100 * grads['conflict_share']:.0f}% of sampled steps")
    _say(f"report: {analysis_dir}/report.md ({len(result['figures'])} figures in {analysis_dir}/figures)")
    _say(verdict(cells, DatasetSpec.load(data_dir), os.path.basename(data_dir), retrieval["ndcg"], grads))
    return analysis_dir


def verdict(cells: dict, spec, column: str, ndcg: dict, grads: dict) -> str:
    """The demo's closing lines: on the generated log, DARE against TWIN in test AUC
    (resolved or not: the difference against two standard errors of it, Hanley and
    McNeil's on the test split) and in search NDCG, and TWIN's gradient conflict."""
    import math

    from dare_tf.training.diagnostics import auc_standard_error, split_labels

    positives, negatives = split_labels(spec, "test")
    dare, twin = (cells[(m, f"{column} d=16")][0] for m in ("dare", "twin"))
    noise = 2 * math.hypot(*(auc_standard_error(a, positives, negatives) for a in (dare, twin)))
    if abs(dare - twin) <= noise:
        auc = f"DARE {dare:.4f} and TWIN {twin:.4f} are within noise (2 standard errors: {noise:.4f})"
    else:
        auc = f"DARE {dare:.4f} {'above' if dare > twin else 'below'} TWIN {twin:.4f} (beyond 2 standard errors: " \
              f"{noise:.4f})"
    search = "DARE's search ranks behaviours " + ("closer to" if ndcg["dare"] > ndcg["twin"] else "no closer to") + \
        f" the mutual-information truth than TWIN's (NDCG {ndcg['dare']:.3f} vs {ndcg['twin']:.3f})"
    return (f"verdict, on the generated log (one seed): test AUC {auc}; {search}; TWIN's shared embeddings get "
            f"conflicting gradients in {100 * grads['conflict_share']:.0f}% of sampled steps, the conflict DARE "
            "removes. The paper's setup: docs/training.md's Table 1 grids and docs/analyses.md.")

