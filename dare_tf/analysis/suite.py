"""The analysis suite as one call: `run_analyses(data_dir, runs, output_dir,
AnalysisConfig(...))` loads trained runs, computes every analysis, writes
`analysis.json`, the figures and `report.md`."""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from dare_tf._faces import public
from dare_tf._files import atomic_json, guard_output_dir
from dare_tf.analysis.config import ANALYSES, AnalysisConfig
from dare_tf.analysis import attention, convergence, dimensions, figures, representation, retrieval
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.data.storage.schema import MODEL_INPUTS
from dare_tf.analysis.runs import forward, load_run, slot_scores

FORMAT = "dare_tf.analysis/1"
_OWN_ENTRIES = {"analysis.json", "report.md", "figures", "dimension_runs"}


def history_length(runs: dict, default: int) -> int:
    """The history length the runs were trained at (`--max_len`; `default`, the dataset's,
    where no run is given), at which the analyses read the examples; runs trained at
    different lengths are refused in one line (the analyses compare them on the same
    examples)."""
    lengths = {label: run.model.model_config.max_len for label, run in runs.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError("--runs: the runs were trained at different history lengths ("
                         + ", ".join(f"{label}: max_len={n}" for label, n in lengths.items())
                         + "); the analyses compare them on the same examples: train them at one --max_len")
    return next(iter(lengths.values()), default)


class _Suite:
    def __init__(self, data_dir, runs, output_dir, config: AnalysisConfig, report):
        from dare_tf.data.feeding.memory import InMemorySplit

        self.data_dir, self.output_dir, self.config, self.say = data_dir, output_dir, config, report
        self.spec = DatasetSpec.load(data_dir)
        self.runs = {label: load_run(label, path, self.spec, data_dir) for label, path in runs.items()}
        self.max_len = history_length(self.runs, self.spec.max_len)
        # (the width the gradient analysis and the dimension cut train at: the first run's)
        self.embedding_dim = next(iter(self.runs.values())).model.model_config.embedding_dim if self.runs else 16
        self.train = InMemorySplit.load(data_dir, "train", self.spec, max_len=self.max_len)
        test = InMemorySplit.load(data_dir, "test", self.spec, max_len=self.max_len)
        self.test = {k: v[: config.max_examples] for k, v in test.features.items()}
        self.test["label"] = test.labels[: config.max_examples]
        self.figures_dir = os.path.join(output_dir, "figures")
        self.figures: dict[str, str] = {}
        self._counts = None

    @property
    def counts(self) -> attention.CooccurrenceCounts:
        if self._counts is None:
            f = self.train.features
            self._counts = attention.CooccurrenceCounts.from_examples(
                f["target_category"], f["hist_categories"], self.train.labels, self.spec.num_categories)
        return self._counts

    def figure(self, name: str, path: str) -> None:
        self.figures[name] = os.path.relpath(path, self.output_dir)

    # -- 1. attention accuracy --------------------------------------------------------
    def attention(self) -> dict:
        cfg = self.config
        frequent = np.argsort(-self.counts.target_examples(), kind="stable")[: cfg.top_categories]
        frequent = frequent[self.counts.target_examples()[frequent] > 0]
        positions = np.arange(1, min(cfg.positions, self.max_len) + 1)
        truth = self.counts.mutual_information(frequent[:, None, None], frequent[None, :, None],
                                               positions[None, None, :])
        learned, correlation, by_target = {}, {}, {}
        for label, run in self.runs.items():
            scores = attention.category_position_scores(run.model, frequent, frequent, positions)
            learned[label] = scores
            by_target[label] = [attention.rank_correlation(truth[i], scores[i]) for i in range(len(frequent))]
            correlation[label] = float(np.nanmean(by_target[label]))
        shown = min(cfg.heatmap_targets, len(frequent))
        path = figures.attention_heatmaps(truth[:shown], {k: v[:shown] for k, v in learned.items()},
                                          frequent[:shown].tolist(), frequent.tolist(),
                                          os.path.join(self.figures_dir, "attention_heatmaps.png"))
        self.figure("attention", path)
        return {"target_categories": frequent.tolist(), "positions": positions.tolist(),
                "ground_truth": truth.tolist(), "learned": {k: v.tolist() for k, v in learned.items()},
                "rank_correlation": correlation, "rank_correlation_by_target": by_target}

    # -- 2. search-stage quality ---------------------------------------------------------
    def retrieval(self) -> dict:
        cfg = self.config
        test = self.test
        keep = self.counts.target_examples()[test["target_category"]] >= cfg.min_target_examples
        valid = test["hist_items"] > 0
        keep &= valid.any(axis=1)
        truths = {"MI ground truth": retrieval.mutual_information_gains(
            self.counts, test["target_category"], test["hist_categories"])}
        planted = retrieval.load_planted_truth(self.spec.source.get("path", ""))
        if planted is not None:
            raw = np.array([0] + [int(r) for r in read_id_map(self.data_dir, "category")] + [0], np.int64)
            truths["planted truth"] = retrieval.planted_gains(planted, raw[test["target_category"]],
                                                              raw[test["hist_categories"]])
        scores = {label: slot_scores(run.model, test) for label, run in self.runs.items()}
        # One K for every model: the fewest behaviours any model keeps (a model that
        # keeps the whole history, DIN, is ranked by its own attention and cut there too).
        k = min(run.top_k for run in self.runs.values())
        out = {"examples": int(keep.sum()), "k": {label: k for label in self.runs},
               "kept": {label: run.top_k for label, run in self.runs.items()},
               "ndcg": {}, "ndcg_interval": {}, "planted": None}
        results, per_example = {}, {}
        for truth_name, gains in truths.items():
            results[truth_name] = {}
            for label in self.runs:
                values = retrieval.ndcg_at_k(gains[keep], scores[label][keep], valid[keep], k)
                results[truth_name][label] = retrieval.mean_with_interval(values)
                per_example.setdefault(truth_name, {})[label] = values
        out["ndcg"] = {label: r["mean"] for label, r in results["MI ground truth"].items()}
        out["ndcg_interval"] = results["MI ground truth"]
        mi = per_example["MI ground truth"]
        if "dare" in mi and "twin" in mi:  # the paper's claim, as a paired difference on the same examples
            out["dare_minus_twin"] = retrieval.paired_difference(mi["dare"], mi["twin"])
        if "planted truth" in results:
            out["planted"] = {"ndcg": {label: r["mean"] for label, r in results["planted truth"].items()},
                              "ndcg_interval": results["planted truth"]}
        out["paper"] = self._paper_ndcg(truths["MI ground truth"], valid)
        path = figures.ndcg_bars(results, os.path.join(self.figures_dir, "retrieval_ndcg.png"), str(k))
        self.figure("retrieval", path)
        if keep.any():  # case study: the kept example with the longest history
            i = int(np.flatnonzero(keep)[np.argmax(valid[keep].sum(axis=1))])
            real = valid[i]
            path = figures.retrieval_case(
                truths["MI ground truth"][i][real], {label: s[i][real] for label, s in scores.items()},
                os.path.join(self.figures_dir, "retrieval_case.png"),
                f"Test example {i}: target category {int(test['target_category'][i])}, {int(real.sum())} behaviours")
            self.figure("retrieval_case", path)
            out["case_example"] = i
        return out

    def _paper_ndcg(self, gains: np.ndarray, valid: np.ndarray) -> dict:
        """NDCG as the paper's code computes it: its population (`paper_population`),
        NDCG@20, DARE and TWIN ranked by the category and time part of their score
        (DIN, without a top-K search, by its own attention); None where the
        population is empty on this log."""
        from dare_tf.search.base import TopKSearch

        test = self.test
        keep, population = retrieval.paper_population(self.counts, test["target_category"], test["hist_categories"])
        out = {"population": population, "k": retrieval.PAPER_K, "ndcg": None, "ndcg_interval": None}
        if not keep.any():
            return out
        values = {}
        for label, run in self.runs.items():
            kept = {k: v[keep] for k, v in test.items()}
            scores = slot_scores(run.model, kept, items=not isinstance(run.model.search, TopKSearch))
            values[label] = retrieval.ndcg_at_k(gains[keep], scores, valid[keep], retrieval.PAPER_K)
        out["ndcg_interval"] = {label: retrieval.mean_with_interval(v) for label, v in values.items()}
        out["ndcg"] = {label: r["mean"] for label, r in out["ndcg_interval"].items()}
        if "dare" in values and "twin" in values:
            out["dare_minus_twin"] = retrieval.paired_difference(values["dare"], values["twin"])
        return out

    # -- 3. gradient domination and conflict ---------------------------------------------------
    def gradients(self) -> dict:
        from dare_tf._on_tensorflow import on_tensorflow  # (the split gradients are TensorFlow's tapes)

        done = on_tensorflow("dare_tf.analysis.gradients", "gradient_analysis",
                             [self.data_dir, self.figures_dir, dataclasses.asdict(self.config), self.embedding_dim,
                              self.max_len],
                             "the gradients analysis", self.say, report=self.say, train=self.train)
        for name, path in done["figures"].items():
            self.figure(name, path)
        return done["result"]

    # -- 4. representation discriminability -----------------------------------------------
    def representation(self) -> dict:
        cfg = self.config
        n = len(self.test["label"])
        sample = np.sort(np.random.default_rng(cfg.seed).permutation(n)[: cfg.kmeans_examples])
        subset = {k: v[sample] for k, v in self.test.items()}
        ks = list(cfg.cluster_counts) or representation.default_cluster_counts(len(sample))
        curves = {}
        for label, run in self.runs.items():
            features = forward(run.model, subset, ("features",))["features"]
            curves[label] = representation.cluster_label_information(features, subset["label"], ks, cfg.seed)
        path = figures.representation_information(curves, os.path.join(self.figures_dir, "representation_mi.png"))
        self.figure("representation", path)
        return {"cluster_counts": ks, "examples": int(len(sample)), "estimator": representation.ESTIMATOR,
                "mutual_information": {label: {str(k): v for k, v in c.items()} for label, c in curves.items()}}

    # -- 5. convergence -----------------------------------------------------------------
    def convergence(self) -> dict:
        curves = {label: convergence.validation_curves(run.histories)
                  for label, run in self.runs.items() if run.histories}
        best = {label: max(c["auc"]) for label, c in curves.items() if c["auc"]}
        reference = "twin" if "twin" in best else None
        reach = ({label: convergence.steps_to_reach(c, best[reference]) for label, c in curves.items()}
                 if reference else {})
        # Each seed's own steps to reach it: the seeds' spread is noise too.
        by_seed = ({label: [convergence.steps_to_reach(convergence.validation_curves([h]), best[reference])
                            for h in run.histories] for label, run in self.runs.items() if run.histories}
                   if reference else {})
        spreads = [max(v) - min(v) for v in ([s for s in steps if s is not None] for steps in by_seed.values())
                   if len(v) > 1]
        path = figures.convergence(curves, os.path.join(self.figures_dir, "convergence.png"))
        self.figure("convergence", path)
        return {"curves": curves, "best_val_auc": best, "reference": reference,
                "steps_to_reference_best": reach, "steps_by_seed": by_seed,
                "seed_spread": max(spreads) if spreads else None}

    # -- 6. attention-dimension cut ------------------------------------------------------
    def dimensions(self, dimension_runs: dict[int, str] | None, overwrite: bool = False) -> dict:
        cfg = self.config
        runs = dimensions.train_widths(self.data_dir, cfg, dict(dimension_runs or {}), self.embedding_dim, self.max_len,
                                       os.path.join(self.output_dir, "dimension_runs"), self.say, overwrite)
        x = {k: self.test[k][: cfg.timing_batch] for k in MODEL_INPUTS}
        rows = []
        for width, run_dir in sorted(runs.items()):
            run = load_run(f"attention_{width}", run_dir, self.spec, self.data_dir)
            rows.append({"attention_dim": width, "representation_dim": run.model.model_config.embedding_dim,
                         "test_auc": run.results["test"]["auc"],
                         "search_us_per_example": 1e6 * dimensions.time_search_stage(run.model, x),
                         "run_dir": run_dir})
        path = figures.attention_dimensions(rows, os.path.join(self.figures_dir, "attention_dimensions.png"))
        self.figure("dimensions", path)
        return {"rows": rows, "timing_batch": len(x[MODEL_INPUTS[0]])}


@public("dare_tf.analysis")
def run_analyses(data_dir: str, runs: dict[str, str], output_dir: str, config: AnalysisConfig = AnalysisConfig(),
                 analyses=ANALYSES, dimension_runs: dict[int, str] | None = None, report=print,
                 overwrite: bool = False) -> dict:
    """Runs `analyses` on the trained `runs` (label -> run directory of
    `trainers.train`; the label `twin` is the convergence reference) and writes
    `output_dir/analysis.json`, `output_dir/figures/*.png` and
    `output_dir/report.md`; returns the JSON's content. `dimension_runs` maps
    attention widths to given DARE runs; missing widths of
    `config.attention_dims` are trained into `output_dir/dimension_runs/`
    (`overwrite`: discarding a run there of another configuration or dataset)."""
    unknown = sorted(set(analyses) - set(ANALYSES))
    if unknown:
        raise ValueError(f"analyses: unknown {unknown}; known: {', '.join(ANALYSES)}")
    needs_runs = set(analyses) - {"gradients", "dimensions"}
    if needs_runs and not runs:
        raise ValueError(f"analyses {sorted(needs_runs)} need trained runs (--runs=label:run_dir,...)")
    guard_output_dir(output_dir, _OWN_ENTRIES.__contains__, "the analysis suite")
    os.makedirs(output_dir, exist_ok=True)
    suite = _Suite(data_dir, runs, output_dir, config, report)
    out = {"format": FORMAT, "data_dir": os.path.abspath(data_dir), "dataset": suite.spec.dataset,
           "dataset_fingerprint": suite.spec.fingerprint(), "runs": {k: os.path.abspath(v) for k, v in runs.items()},
           "config": dataclasses.asdict(config), "seconds": {}}
    for name in ANALYSES:
        if name not in analyses:
            continue
        started = time.perf_counter()
        report(f"analysis: {name}")
        out[name] = suite.dimensions(dimension_runs, overwrite) if name == "dimensions" else getattr(suite, name)()
        out["seconds"][name] = time.perf_counter() - started
    out["figures"] = suite.figures
    atomic_json(os.path.join(output_dir, "analysis.json"), out)
    from dare_tf.analysis.report import write_report

    write_report(out, os.path.join(output_dir, "report.md"))
    return out
