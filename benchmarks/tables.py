"""Writes the benchmark tables of `docs/benchmarks.md` (and the README's marked
sections) from `benchmarks/results/*.json`: each with its date, machine and
command. Numbers are never typed by hand: run a benchmark, then this.

Usage: python benchmarks/tables.py [--check]

`--check` exits 1 when a generated file is out of date (a test runs it).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import RESULTS_DIR  # noqa: E402

DOC = os.path.join(REPO, "docs", "benchmarks.md")
README = os.path.join(REPO, "README.md")
MEMORY_COLUMNS = ["run", "train_examples", "batch", "peak_mib", "+tensorflow", "+keras_dare_tf",
                  "+data_and_model", "+first_step", "+trained", "+tested"]
# Which columns of which part to show, and what a table says its numbers are.
TABLES = {
    ("bench_data", "prepare"): (["rows", "layout", "seconds", "rows_per_s", "peak_rss_mib", "output_mb", "output/csv"],
                                "data.prepare on generated Taobao-format logs: seconds, peak RSS (MiB), output "
                                "size (MB) and its ratio to the raw CSV"),
    ("bench_data", "train"): (["input", "train_samples_per_s", "vs_previous", "rounds", "steps", "test_auc",
                               "peak_rss_mb"],
                              "trainer samples/s on the 1M-row log of `bench_train.py --parts end_to_end` (3,000 "
                              "users, 50k items; DARE d=16, batch 256, 2 epochs, Adam): median of the rounds, "
                              "ratio to the previous commit's trainer in the same run"),
    ("bench_data", "checks"): (["what", "seconds", "us_per_record", "of_a_streamed_epoch"],
                               "what reading checks cost: one pass over the train part's dataset's shards, per record, "
                               "and as a share of one streamed training epoch"),
    ("bench_data", "load"): (["dataset", "examples", "shards", "code", "first_s", "again_s", "previous/this (first)",
                              "previous/this (again)"],
                             "what a training run reads before its first step (the three splits and the store, "
                             "checked): seconds in a fresh process (first) and again in it, median of the rounds, "
                             "this commit against the last commit that read each shard on its own; the ratio is "
                             "the previous commit's seconds over this one's"),
    ("bench_data", "workers"): (["workers", "worker", "peak_rss_mb", "store_mb", "steps"],
                                "peak RSS (MB) and store memory (MB) per process, 200 steps on the 1M-row log"),
    ("bench_scale", "generate"): (["log", "fraction", "rows", "seconds", "rows_per_s", "rate/1M-row rate",
                                   "peak_rss_mib", "mb_written", "generator_auc", "target_s", "seconds/target"],
                                  "`data.synthetic --like` (dare_tf.data.generation.lifelike) on this 2-core machine, "
                                  "each run in its own process: a 1M-row log and the real size (fraction 1), wall "
                                  "seconds, rows per second and its ratio to the 1M-row log's, peak RSS (MiB), MB "
                                  "written, the generator's own test AUC, and seconds against the issue's target of "
                                  "300"),
    ("bench_scale", "prepare"): (["log", "fraction", "rows", "seconds", "rows_per_s", "rate/1M-row rate",
                                  "peak_rss_mib", "mb_written", "users", "examples", "target_s", "seconds/target"],
                                 "`data.prepare` (the in-memory driver, its default protocol; Tmall with "
                                 "`--fields=seller,brand`) of the generated logs above, each in its own process: "
                                 "wall seconds, log rows per second and its ratio to the 1M-row log's, peak RSS (MiB), "
                                 "MB written, qualifying users, examples, and seconds against the issue's target of "
                                 "1,200 (at no more than 12 GB peak)"),
    ("bench_scale", "beam"): (["log", "fraction", "rows", "seconds", "rows_per_s", "peak_rss_mib",
                               "worker_peak_rss_mib", "memory_bound_mib", "memory/target", "mb_written", "examples",
                               "records_identical", "in_memory_s", "over_in_memory", "target_over_in_memory"],
                              "`data.prepare --runner=beam` on Beam's DirectRunner (`" + "--direct_num_workers=2 "
                              "--direct_running_mode=multi_processing`, both cores), each in its own process: wall "
                              "seconds, rows per second, peak RSS (MiB) of the driver process and of the largest "
                              "worker process, their bound (the driver and both workers at their peaks at once) over "
                              "the issue's 12 GB, MB written, examples, whether every shard, its records and counts "
                              "are the in-memory driver's (spec.json's sha256 of each file), and its seconds over the "
                              "in-memory driver's on the same log, measured in the same run (target: at most 2)"),
    ("bench_scale", "train"): (["log", "fraction", "items", "optimizer", "steps", "samples_per_s",
                                "rate/1M-row rate", "epoch_h", "startup_s", "eval_per_s", "peak_rss_mib",
                                "test_auc"],
                               "DARE (d=16, batch 2048) trained streamed from the TFRecord shards (`in_memory_mb=0`) "
                               "for a fixed number of steps, each in its own process: samples/s of the training "
                               "steps and its ratio to the same optimizer's on the 1M-row log (42k items), the "
                               "projected hours of one epoch, seconds before the first step, examples/s of the "
                               "validation pass (the `evaluate` phase), peak RSS (MiB; target at 4.16M items: 8 GB, "
                               "and a rate of at least 0.8 of the 1M-row log's) and test AUC after those steps"),
    ("bench_scale", "input"): (["log", "fraction", "cpus", "train_records", "gz_bytes_per_example",
                                "raw_bytes_per_example", "read_per_s", "parse_per_s", "assemble_per_s",
                                "pipeline_per_s", "per_core", "bound_per_s", "pipeline/bound",
                                "record_shuffle_per_s", "vs_record_shuffle"],
                               "the trainer's streamed input alone (benchmarks/scale_input.py: TFRecord shards read "
                               "in blocks of 256 records, parsed and shuffled as units, the examples of every 16 "
                               "blocks permuted, windows of L=200 assembled; no model), batch 2048, on "
                               "one core (`taskset -c 0`) and on both: examples/s of each stage alone (read and "
                               "inflate, read and parse, assemble) and of the whole, per core (target 250k), the "
                               "bound `1 / sum(1 / stage)` and the measured share of it; beside it, in the same "
                               "process, the baseline: the previous pipeline (records interleaved and shuffled one "
                               "by one through a 100k buffer, then batched and parsed) and the whole's ratio to it; "
                               "bytes per example on disk "
                               "(GZIP) and parsed"),
    ("bench_scale", "export"): (["log", "fraction", "export_s", "export_peak_rss_mib", "mb_written", "load_s",
                                 "rank_p50_ms", "rank_p99_ms", "rank_p50/1M-row p50", "served_rss_mib"],
                                "`serving.export` of the trained DARE run with its full id maps (its own process), "
                                "then in a fresh process the SavedModel loaded (seconds; target 60) and `rank` of one "
                                "user's 200 behaviours against 200 candidates, measured in process (`LocalModel`): "
                                "p50/p99 ms and the p50 against the 1M-row log's (target at most 1.2), the process's "
                                "peak RSS"),
    ("bench_scale", "load"): (
        ["log", "fraction", "store", "users", "seconds", "peak_rss_mib", "mb_stored", "clicks_kept",
         "most_clicks_of_a_user", "last_p50_ms", "last_p99_ms"],
        "a prepared dataset's histories loaded into a new LMDB store (`serving.histories load --data_dir=...`, its "
        "own process) at the lifelong default cap (`--max_clicks`, 10,000 clicks per user): users, seconds, the "
        "process's peak RSS, MB stored, the clicks kept and the most of one user, and `last` of one random user's "
        "200 newest clicks measured in process (p50/p99 ms)"),
    ("bench_scale", "histories"): (["log", "fraction", "store", "users", "seconds", "target_s", "seconds/target",
                                    "peak_rss_mib", "mb_stored", "last_p50_ms", "last_p99_ms"],
                                   "every user of the raw log appended to a new history store (`serving.histories "
                                   "append --input=LOG`, its own process): LMDB (target 600 s at full size) and a "
                                   "local redis-server (target 900 s): users, seconds, the appending process's peak "
                                   "RSS, MB stored (LMDB's file, Redis's used_memory), and `last` of one random "
                                   "user's last 200 clicks measured in process (p50/p99 ms)"),
    ("bench_scale", "retrieval"): (["log", "fraction", "train_s", "export_s", "peak_rss_mib", "mb_written",
                                    "served_p50_ms", "served_p99_ms", "batch16_matmul_ms", "batch16_top400_ms",
                                    "batch16_blocked_top400_ms", "exact_p50_ms", "exact_p99_ms", "ann", "ann_build_s",
                                    "ann_p50_ms", "ann_p99_ms", "ann_recall"],
                                   "the two-tower retrieval stage trained (one epoch, recall measured on 20,000 "
                                   "validation and test positives) and exported over the whole catalogue, its own "
                                   "process; then, in process, per query of one test history: the export's "
                                   "`serving_default` (query tower, every item scored, the merged sources' top 200), "
                                   "what its two costly steps take per query in a batch of 16 (the scores' matrix "
                                   "product, the two-tower source's top 400 by `tf.math.top_k` over the row and, as "
                                   "the export now takes it, by blocks: `blocked_top_k`), "
                                   "an exact top-200 of the candidate vectors (faiss flat), and the faiss inverted "
                                   "file (`dare_tf.retrieval.index`, probes calibrated on 100 other queries to 0.97): "
                                   "build seconds, p50/p99 ms (target 20 ms) and its recall of the exact top-200 on "
                                   "900 held-out test queries (target 0.95)"),
    ("bench_scale", "recommend"): (["log", "fraction", "batch_timeout_ms", "clients", "calls", "p50_ms", "p99_ms",
                                    "per_s", "server_rss_mib"],
                                   "`Recommender` (retrieval, then `rank` of 200 candidates, top 10) through the "
                                   "stand-in server serving both exports (its own process) with the export's "
                                   "batching file, its `batch_timeout_micros` as given (the export writes 1 ms), "
                                   "from 1 and 16 client threads: p50/p99 ms, recommendations per second (target "
                                   "at full size: 150/s at p99 150 ms for 16 clients) and the server's RSS"),
    ("bench_layers", "presets"): (["preset", "batch", "graph", "xla", "xla/graph"],
                                  "forward+backward samples/s of every preset (L=200, K=20, d=16, 50k items): the "
                                  "step as one graph, and with the model's dense stages compiled by XLA inside it"),
    ("bench_layers", "models"): (["model", "L", "ms", "ns_per_behaviour", "vs_twin"],
                                 "stage 1 alone of each model (`BehaviorSearch.search_only` after the attention "
                                 "lookup), batch 128, XLA: ms per call, ns per behaviour, ratio to TWIN in the same "
                                 "run"),
    ("bench_train_tensorflow", "long"): (["model", "L", "samples_per_s", "us_per_behaviour", "per_behaviour_vs_L1000",
                                          "peak_rss_mb"],
                                         "DARE's train step by history length L (batches assembled from a store by "
                                         "the real pipeline, then Keras's train function; Adam, K=20, 50k items, each "
                                         "configuration in its own process): samples/s, microseconds per behaviour, "
                                         "its ratio to L=1,000, peak RSS (MB); `aux=retrieved` looks up the K kept "
                                         "slots only, `aux=all` is the reference's auxiliary head over all L slots"),
    ("bench_long", "rank"): (["L", "N", "signature", "request_kb", "bytes_over_history", "p50_ms", "p99_ms",
                              "examples_per_s", "bound_ms", "p50_over_bound"],
                             "one user's history of L behaviours against N candidates, measured in process (the "
                             "SavedModel loaded in the benchmark's process; DARE K=20, d=16, untrained): the `rank` "
                             "signature (history sent once, scored against all N in one product) and "
                             "`serving_default` with the history repeated per candidate; request KB and its ratio "
                             "to one history plus the candidates (int64 ids), p50/p99 ms, examples/s, and the bound "
                             "from the sizes (score product N x L x Da, K representation rows and the MLP per "
                             "candidate, at the float32 multiply-add rate of a large matrix product in the same "
                             "run)"),
    ("bench_long", "standin"): (["L", "N", "clients", "p50_ms", "p99_ms", "examples_per_s", "in_process_p50_ms"],
                                "the same `rank` requests measured through the stand-in server (its own process, "
                                "gRPC, batching on with the exported batching parameters), from 1 client and from "
                                "8 concurrent clients (their requests merged by the batcher): p50/p99 ms, "
                                "examples/s, and the in-process p50 of the same request"),
    ("bench_long", "histories"): (["store", "users", "L", "p50_ms", "p99_ms", "clicks_per_s"],
                                  "the history service's `last(users, L)` at L = 10,000, measured in process (LMDB "
                                  "embedded; Redis on localhost): p50/p99 ms of 200 calls and clicks read per "
                                  "second"),
    ("bench_cascade", "index"): (None,
                                 "the retrieval index (`tfrs.layers.factorized_top_k.BruteForce`, 32-d, top 200) "
                                 "against a numpy brute force: build seconds, ms per call, and whether both return "
                                 "the same top 200"),
    ("bench_daily", "loop"): (["day", "items", "train_examples", "steps", "continued", "test_auc", "served_version",
                               "data_s", "train_s", "export_s", "switch_s", "retrain_steps", "retrain_test_auc",
                               "retrain_s"],
                              "the day-by-day loop (examples/daily_loop.py) on a generated log of 600 users over "
                              "5 days, measured in process (the stand-in server in the same process): per day, "
                              "the id vocabulary, the train examples of the days so far, the run's steps (the "
                              "first day one epoch from scratch, then 100 steps continued from the previous "
                              "day's run), its test AUC (the day's clicks), the version the server switched to, "
                              "and the seconds to prepare (the first day) or append the day (`data_s`), train, "
                              "export and switch; beside each continued day, "
                              "a full retrain on the same days (one epoch): its steps, test AUC and seconds"),
    ("bench_append", "append"): (None, "`data.prepare --append` of a generated log's last day to its other days "
                                       "(prepared with --split=time) against `data.prepare --split=time` of the "
                                       "whole log, each in its own process in the same run (seconds, peak RSS in "
                                       "MiB): the log's and the day's rows, what an append must read (the day's "
                                       "rows and the past clicks of that day's users), the store partitions it "
                                       "rewrote and the clicks it read from them, the ratio of the two times, and "
                                       "the same append's phases measured in process"),
    ("bench_fields", "step"): (None, "DARE and TWIN (L=200, K=20, d=16, 50k items) with 0 to 4 extra behaviour "
                                     "fields of width 16 (`ModelConfig.fields`; of several, the last history-only): "
                                     "the attention and representation widths, samples/s of Keras's train step "
                                     "(FusedAdam) and of prediction on in-memory batches, measured in process in the "
                                     "same run, and the ratio to the same preset without fields"),
    ("bench_train_jax", "presets"): (
        ["preset", "batch", "device", "train", "predict"],
        "samples/s of every preset's Keras train step (Adam) and prediction on Keras's JAX backend, measured in "
        "process on the lent GPU (the `device` column), all in the same run (L=200, K=20, d=16, 50k items, "
        "in-memory batches)"),
    ("bench_gpu_before", "rows"): (
        ["model", "batch", "harness_examples_per_s", "trainer_steps_examples_per_s", "share_of_harness",
         "compile_s", "epoch_s", "full_epoch_projected_s", "step_bytes", "bound_examples_per_s", "measured_over_bound",
         "peak_memory_bytes"],
        "before: the trainer on JAX with JAX's own table gradients (`trainers.train`'s jitted steps, windows "
        "gathered on the device, 50 steps a call) against the same model's `model.fit` on in-memory numpy batches "
        "(the harness), measured in process on the lent GPU (the JSON's `device`: an NVIDIA H200) in the same run, "
        "d=16, L=200, on a Taobao-like log generated and prepared on that machine at a fraction of its size (the "
        "JSON's `fraction`, `train_examples`): examples/s of the training steps, their share of the harness, the "
        "compile seconds of the run's functions, one epoch's wall seconds (its validations every 150 steps, "
        "BatchNorm refreshes, checkpoints, test predictions and saved model included), the full split's 5.1M "
        "examples projected at the steps' rate, XLA's bytes accessed per step and the rate those bytes allow at the "
        "card's memory bandwidth (the JSON's `device.bandwidth`), and the process's peak device memory so far"),
    ("bench_gpu_before", "profile"): (
        ["model", "batch", "name", "share", "us_per_step", "count_per_step"],
        "before: where a training step's time goes with JAX's own table gradients, the ten largest kernels of "
        "one call of 50 steps under `jax.profiler` on the lent H200 (XLA's fusion names; a scatter fusion is a "
        "table's gradient, `loop_add_subtract` Adam's update of the item tables): their share of the kernels' "
        "time, microseconds and launches per step"),
    ("bench_gpu", "steps"): (
        ["model", "batch", "gradients", "examples_per_s", "over_previous", "step_bytes", "bound_examples_per_s",
         "measured_over_bound"],
        "the steps taken, each measured against the one before it in the same process on the lent H200: the "
        "trainer's training steps (50 a call) with each way of building the table gradients "
        "(`dare_tf.layers.table_gradients`: `xla`, JAX's own; `materialized`, one scatter of the cotangents "
        "computed beforehand; `privatized`, that and each small table's gradient summed into 32 copies, then "
        "added), examples/s, the ratio to the row above, XLA's bytes per step and the share of the rate those bytes "
        "allow at the card's bandwidth"),
    ("bench_gpu", "profile"): (
        ["model", "batch", "gradients", "name", "share", "us_per_step", "count_per_step"],
        "after: where a training step's time goes with the fastest table gradients of the table above, the ten "
        "largest kernels of one call of 50 steps under `jax.profiler` on the lent H200 (a kernel run for two "
        "tables of one shape counts 2 a step)"),
    ("bench_gpu_epoch", "steps"): (
        ["model", "batch", "gradients", "examples_per_s", "over_previous", "step_bytes", "measured_over_bound"],
        "the ids sorted first (`sorted`: where a table has fewer rows than the lookups, so XLA's scatter sums each "
        "run of equal ids before its atomic add; `sorted_all`: every table), measured against the modes before "
        "them in another call of the same H200: slower"),
    ("bench_gpu_epoch", "rows"): (
        ["model", "batch", "epoch_s", "compile_s", "validation_s", "epoch_s_cached", "compile_s_cached",
         "train_seconds_cached", "validation_s_cached", "trainer_steps_examples_per_s"],
        "one epoch of the trainer on the lent H200 (DARE on the Taobao-like log at the fraction of the JSON, with "
        "the `sorted` table gradients of that call), started cold, then again with its compiled functions read from "
        "JAX's persistent compilation cache (`--compilation_cache`): wall seconds, compile seconds, the "
        "validations' seconds (six, with their BatchNorm refreshes), the seconds of the training loop, and the "
        "fastest training steps' rate of that call (its `gradients` column above)"),
    ("bench_backends", "rows"): (
        ["dataset", "model", "tensorflow_auc", "jax_auc", "difference", "two_se", "within_noise", "tensorflow_s",
         "jax_s"],
        "test AUC (mean of 3 seeds) of `trainers.train` on Keras's TensorFlow and JAX backends with the same flags "
        "(batch 128, 3 epochs), the difference against two standard errors of the difference, and each 3-seed "
        "run's wall seconds on this machine's CPUs"),
    ("bench_fleet", "load"): (
        ["store", "model_servers", "per_s", "p50_ms", "p99_ms", "failures"],
        "16 clients of `recommend` by user id (the history read from the store, 200 retrieval candidates, the "
        "ranker's `rank`), measured through the stand-in server (one or two replicas, round robin) on this "
        "machine, in the same run: recommendations/s, p50 and p99 latency (ms) and failed requests, per store"),
    ("bench_fleet", "faults"): (
        ["fault", "recommendations", "failed", "appended", "acknowledged_lost", "duplicated",
         "recommend_recovery_s", "append_recovery_s", "cluster_errors_retried"],
        "each fault under the load above (the cluster, two stand-ins) with an appender acknowledging each click on "
        "its master and one replica: recommendations served and failed, clicks acknowledged, lost and held twice, "
        "and the seconds from the kill until recommendations and appends answer within twice their p99 before it"),
    ("bench_recommend", "rows"): (
        ["call", "seconds", "tensorflow_first_seconds", "ratio"],
        "one command-line call of the serving programs, a new process each (median of 5 after one unmeasured), "
        "through the stand-in server on this machine (docs/serving.md's walkthrough: DARE and the retrieval model, "
        "the histories in LMDB): wall seconds, the same call with TensorFlow imported first, and their ratio"),
    ("bench_jax_stream", "rows"): (
        ["input", "train_examples", "batch", "steps", "examples_per_s", "vs_in_memory", "peak_rss_mb", "rounds"],
        "the trainer on JAX (DARE, batch 512, this machine's CPU as the device) on a generated Taobao-format log, "
        "its splits held in memory or streamed from the shards (`--in_memory_mb=0`), each run its own process, "
        "alternating, in the same run of the benchmark: training examples/s after the first validation (the "
        "median of the rounds), the ratio to the in-memory rate, and the process's peak resident memory"),
    ("bench_windows", "rows"): (
        ["method", "examples_per_s", "bound_examples_per_s", "measured_over_bound"],
        "a training batch's history windows (L=200, batch 2048, items and categories, a store of 20M clicks) "
        "assembled on this machine's CPU, measured in process in the same run: in numpy by 1, 2 and 4 threads "
        "(`InMemorySplit.host_batches`), and as the jitted gather the trainer on JAX runs inside its step "
        "(`DeviceSplit.assemble`), against the bound of the bytes each example moves (a 64-byte line read per "
        "slot and its ids written) at the memory bandwidth `np.copyto` reaches"),
    ("bench_fields_jax", "step"): (
        None, "the step cost of behaviour fields on the lent NVIDIA H200, Keras on JAX (`bench_fields.py`: DARE and "
              "TWIN, L=200, K=20, d=16, 50k items, 0 to 4 extra fields of width 16, batch 2048), measured in process "
              "in the same run, with the ratio to the same preset without fields"),
    ("bench_field_value", "tmall_sample"): (
        None, "test AUC (mean and std over 3 seeds) of DARE and TWIN on the Tmall sample with item and category "
              "only, with its seller and brand (`--fields=seller,brand`), with the time gap, and with both; the "
              "gain over item and category only; each run `trainers.train` (batch 256, 2 epochs, L=100, K=20) on "
              "one dataset prepared with every field (min_clicks 50, 10 train targets), the same examples"),
    ("bench_field_value", "synthetic_brands"): (
        None, "test AUC (mean and std over 3 seeds) of DARE and TWIN on a generated log whose users favour two of "
              "200 brands across categories (`data.synthetic --users=1500 --brands=200 --p_brand=0.3`), with item "
              "and category only, with the brand, with the time gap, and with both; settings as on Tmall"),
    ("bench_cascade", "merge"): (None,
                                 "the merged first 200 candidates of 256 users (histories of 200), measured in "
                                 "process: `CandidateMerger` (each source's `top_k`, sorts over the proposals) "
                                 "against the same merge over catalogue-wide rank matrices (how the package merged "
                                 "before; the candidates agree exactly), ms per batch; the tower's top-k alone "
                                 "(common to both: the floor) and the merge's time over it; catalogue-wide entries "
                                 "(4C) over the proposals read (3(N + L) + 2N)"),
    ("bench_cascade", "recommend"): (["path", "clients", "calls", "p50_ms", "p99_ms", "recommendations_per_s",
                                      "served/in_process", "clicks_appended", "errors", "server_rss_mb", "store_mb"],
                                     "`recommend` (retrieval, then DARE ranking 200 candidates with `rank`; "
                                     "histories of 200, top 10): latency percentiles (ms) and recommendations/s, "
                                     "measured in process and through the stand-in server with concurrent clients; "
                                     "by user id, the history is read from the history service (LMDB) at call time "
                                     "while a writer appends clicks (16 clients): errors, the server's resident "
                                     "memory (MB) and the store's size (MB) before and after"),
    ("bench_quality", "table1"): (None, "`make demo`: test AUC of each model on the demo's synthetic log and on the "
                                        "real Taobao sample (one seed, one epoch)"),
    ("bench_quality", "by_length"): (None, "`make demo`: DARE's test AUC on the synthetic log by the history length "
                                           "of the example (examples per bucket)"),
    ("bench_serving", "grpc"): (["batch", "clients", "requests", "errors", "p50_ms", "p99_ms", "qps",
                                 "served_examples_per_s", "served/in_process", "rss_mb_before", "rss_mb_after"],
                                "a trained DARE export (L=200, K=20, d=16) behind the stand-in server with batching, "
                                "over gRPC (`serving.client`): latency (ms), throughput, the ratio to the SavedModel "
                                "called in process, and the server's resident memory (MB) before and after the row"),
    ("bench_serving", "rest"): (["batch", "clients", "requests", "errors", "p50_ms", "p99_ms", "qps",
                                 "served_examples_per_s", "served/in_process", "rss_mb_before", "rss_mb_after"],
                                "the same export and server over REST (TF Serving's columnar JSON, one kept-alive "
                                "HTTP/1.1 connection per client)"),
    ("bench_quality", "retrieval"): (None, "`make demo`: recall@K on the test positives of the merged candidates "
                                           "(what `recommend` uses) and of each source alone: the two-tower model, "
                                           "the most popular items, the popular items of the user's recent "
                                           "categories; already-clicked items excluded"),
    ("bench_quality", "cascade"): (None, "`make demo`: recall@N of each candidate source and of the merged "
                                         "candidates, then HitRate@10 and NDCG@10 of the clicked item for the "
                                         "merged order and for each ranker reordering the merged candidates"),
    ("bench_quality", "analyses"): (None, "`make demo`'s analyses on the synthetic log: search-stage NDCG@K (one "
                                          "K for every model) against the MI and the planted truth, Spearman "
                                          "correlation of learned and true attention, the largest adjusted mutual "
                                          "information of k-means clusters and the label over the k sweep, and "
                                          "steps to reach TWIN's best validation AUC"),
    ("bench_quality", "gradients"): (None, "`make demo`'s gradient analysis over a full run (samples at equal "
                                           "fractions of its steps): the median and the final "
                                           "representation/attention gradient norm ratio, and the share of sampled "
                                           "steps whose two gradients conflict (negative cosine)"),
    ("bench_quality", "dimensions"): (None, "`make demo`'s attention-dimension cut: DARE with narrower attention "
                                            "embeddings, test AUC and search-stage microseconds per example"),
    ("bench_quality", "demo_time"): (None, "`make demo` end to end: wall seconds, and examples of each prepared "
                                           "dataset"),
    ("bench_quality", "schedule"): (None, "DARE with the trainer's default schedule (2 epochs; a validation every "
                                          "150 steps, or fewer so that a run validates at least 5 times) by log size "
                                          "and batch size: training steps, validations, test AUC, wall seconds on "
                                          "this machine and the run's undertraining warnings"),
    ("bench_quality", "negatives"): (None, "the retrieval stage with its defaults (10 epochs, batch 512) and N "
                                           "catalogue items drawn uniformly per batch as extra negatives "
                                           "(`--uniform_negatives=N`): recall@50 and @200 of the merged candidates "
                                           "and of the tower alone, most-popular's recall@200 and the quotas chosen on "
                                           "the "
                                           "validation positives (tower / popularity / recent categories: 0 leaves "
                                           "a source out), on the demo's synthetic "
                                           "log (2,000 users) and the retrieval tests' two planted logs (800 users "
                                           "each); wall seconds of the whole program on this machine"),
    ("bench_quality", "baselines"): (None, "DARE and four baselines with the demo's training settings (one epoch, "
                                           "batch 512, learning rate 0.005, K=20, d=16) and a validation every 60 "
                                           "steps: test AUC, mean and std "
                                           "over 3 seeds, on the demo's synthetic log and the real Taobao sample"),
    **{("bench_two_stage", log): (["model", "negatives", "test_auc", "hit_rate@10", "retrieval_hit_rate@10", "ratio",
                                   "vs_retrieval", "vs_retrieval_se", "ndcg@10", "retrieval_ndcg@10", "seeds",
                                   "seeds_hit_rate@10", "seeds_hit_rate@10_std"],
                                  f"the cascade on {what}: each ranker (the demo's cascade schedule, only the "
                                  "training negatives differ; `prepared` = the paper's) reordering the retrieval "
                                  "run's 200 candidates of every test click: the paper's test AUC, HitRate@10 "
                                  "reranked (first seed) and in the retrieval order, their ratio, the paired "
                                  "difference with one standard error, NDCG@10 reranked and in the retrieval order; "
                                  "with several seeds, the mean and std of the reranked HitRate@10 over them")
       for log, what in (("demo", "the demo's synthetic log (2,000 users)"), ("taobao", "the Taobao sample"),
                         ("planted", "a planted log whose sessions rarely leave their category (p_session 0.9)"))},
    ("bench_two_stage", "floor"): (["log", "recent_floor", "model", "quotas", "recall@200", "hit_rate@10",
                                     "hit_rate@10_se", "retrieval_hit_rate@10", "positives"],
                                    "what the retrieval run's floor on the recent-categories source's quota "
                                    "(`--recent_floor`) costs: for each floor, the quotas chosen on validation "
                                    "(tower / popularity / recent categories), the merged candidates' test "
                                    "recall@200, and the cascade's held-out HitRate@10 (with one standard error) "
                                    "of a ranker trained on that run's candidates (the demo's cascade schedule, "
                                    "negatives uniform:8,retrieval:8) and of the retrieval order, on the same "
                                    "test clicks"),
    ("bench_paper", "paper_population"): (None, "the Taobao-like log of `benchmarks/bench_paper.py` (the real-size "
                                                "generator at a fraction, the paper's protocol): its size, and how "
                                                "many test examples each NDCG population keeps: the paper's (a "
                                                "target category with >= 700 training examples, at most `max_thin` "
                                                "behaviours in thin cells) and the package's (a target category "
                                                "with >= 50)"),
    ("bench_paper", "paper_claims"): (["claim", "statistic", "paper", "dare", "twin", "din", "dare_minus_twin",
                                       "verdict", "seeds"],
                                      "the paper's claims on that log: DARE, TWIN and DIN at d=16 (Adam, learning "
                                      "rate 0.01, batch 2048, one epoch), one run per seed, the analysis suite per "
                                      "seed; each number the mean over the seeds ± one standard error, DARE minus "
                                      "TWIN paired by seed, and the verdict against two standard errors (for steps, "
                                      "at least one validation interval)"),
    ("bench_paper", "paper_dimensions"): (None, "DARE's attention-dimension cut on that log, per seed the DARE run "
                                                "above (attention width 16) and the same training at narrower "
                                                "attention widths: test AUC and its difference from width 16 (paired "
                                                "by seed), the search stage's microseconds per example (XLA, a batch "
                                                "of 1,024, measured in process) and its ratio to width 16's; mean ± "
                                                "one standard error over the seeds"),
    ("bench_memory", "stages"): (MEMORY_COLUMNS,
                                 "where a small run's memory goes (benchmarks/bench_memory.py): one DARE run on the "
                                 "Taobao sample in its own process (the trainer's defaults, batch 256), measured in "
                                 "process: its peak RSS (MiB) and what each stage added to the resident set: "
                                 "TensorFlow imported, Keras and dare_tf loaded, the data read and the model built, "
                                 "the first step (traced; with XLA, compiled), the rest of training with every "
                                 "validation, the test evaluation; by default (XLA, splits in memory), without "
                                 "XLA, and streamed"),
    ("bench_memory", "stages_before"): (MEMORY_COLUMNS,
                                        "the same, before the splits evaluated from memory got a batch of their "
                                        "size (each padded to eval_batch_size 8192)"),
}
MARK = re.compile(r"(<!-- table:(\w+)/(\w+) -->\n).*?(<!-- /table -->)", re.S)


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value)
    return str(value)


def table(name: str, part: str, payload: dict) -> str:
    rows = payload[part]
    columns, what = TABLES.get((name, part), (None, part))
    columns = columns or list(rows[0])
    lines = [f"{what}.", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    run = payload.get("meta", {}).get(part, payload)  # when, where and how this part ran
    machine = run.get("machine") or {}
    lines += ["", f"Measured {run.get('written', '?')} on {machine.get('platform', '?')} "
                  f"({machine.get('cpus', '?')} CPUs): `{run.get('command', name)}`."]
    return "\n".join(lines)


def results() -> dict[str, dict]:
    out = {}
    for path in sorted(glob.glob(os.path.join(RESULTS_DIR, "*.json"))):
        with open(path) as f:
            out[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    return out


def render_doc(found: dict[str, dict]) -> str:
    parts = ["# Benchmarks", "", "Generated by `python benchmarks/tables.py` from `benchmarks/results/*.json`; "
             "each table names the command that measured it. Ratios compare runs made in the same run of a "
             "program (this machine is noisy).", ""]
    for name, payload in found.items():
        parts += [f"## {name}", ""]
        for part, rows in payload.items():
            if isinstance(rows, list) and rows and isinstance(rows[0], dict):
                parts += [f"### {part}", "", table(name, part, payload), ""]
    return "\n".join(parts)


def render_marks(text: str, found: dict[str, dict]) -> str:
    def replace(m):
        name, part = m.group(2), m.group(3)
        if name not in found or part not in found[name]:
            return m.group(0)
        return m.group(1) + table(name, part, found[name]) + "\n" + m.group(4)
    return MARK.sub(replace, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    found = results()
    stale = []
    targets = {DOC: render_doc(found)}
    for path in [README] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
        if path == DOC:
            continue
        with open(path) as f:
            targets[path] = render_marks(f.read(), found)
    for path, text in targets.items():
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(os.path.relpath(path, REPO))
            if not args.check:
                with open(path, "w") as f:
                    f.write(text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python benchmarks/tables.py)")
        sys.exit(1)
    print("up to date" if args.check else f"wrote {', '.join(stale) or 'nothing (up to date)'}")


if __name__ == "__main__":
    main()
