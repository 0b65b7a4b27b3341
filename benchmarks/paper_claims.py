"""The paper's claims read from `bench_paper.py`'s per-seed analyses: each number as
its mean over the seeds with one standard error (`claims`), and the log's
populations (`population`). A claim "holds" only where the seeds' mean difference
in the paper's direction is beyond two standard errors of it (and, for steps, beyond
one validation interval); below minus that, it "does not reproduce"; otherwise it is
"not distinguishable"."""

from __future__ import annotations

import math

import numpy as np

from dare_tf.analysis.report import PAPER, WITHIN_NOISE, compared

VALIDATION_INTERVAL = 100  # bench_paper's --eval_every: the resolution of steps-to-reach


def mean_se(values) -> tuple[float | None, float | None]:
    """The mean of the finite values and its standard error (None with fewer than two)."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None, None
    return float(np.mean(v)), (float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None)


def verdict(mean, se, floor: float = 0.0) -> str:
    """`mean` is a difference in the paper's direction (positive: as the paper
    found), decided as `report.md` decides it (`dare_tf.analysis.report.compared`)
    against the larger of two standard errors and `floor`."""
    if mean is None or se is None:
        return "not distinguishable (fewer than two seeds)"
    holds = compared(mean, max(2 * se, floor))
    return {True: "holds", False: "does not reproduce", WITHIN_NOISE: "not distinguishable"}[holds]


def within(mean, se, low: float, high: float) -> str:
    """Whether a value lies in `[low, high]` (the paper's ratio within 2x, as `report.md`
    reads domination): its mean +/- two standard errors inside, outside, or across the edges."""
    if mean is None or se is None:
        return "not distinguishable (fewer than two seeds)"
    if low <= mean - 2 * se and mean + 2 * se <= high:
        return "holds"
    return "does not reproduce" if mean + 2 * se < low or mean - 2 * se > high else "not distinguishable"


def _cell(mean, se, digits: int | None = None) -> str:
    if mean is None:
        return ""
    digits = (4 if abs(mean) < 10 else 0) if digits is None else digits
    return f"{mean:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def _row(claim: str, statistic: str, paper: str, per_model: dict, difference=None, direction: int = 1,
         floor: float = 0.0, decided=None, digits: int | None = None) -> dict:
    """A table row from each model's per-seed values and the per-seed differences."""
    row = {"claim": claim, "statistic": statistic, "paper": paper}
    for model in ("dare", "twin", "din"):
        mean, se = mean_se(per_model.get(model, []))
        row[model] = _cell(mean, se, digits)
        row[f"{model}_mean"], row[f"{model}_se"] = mean, se
    if difference is not None:
        mean, se = mean_se(difference)
        row["dare_minus_twin"] = _cell(mean, se, digits)
        row["difference_mean"], row["difference_se"] = mean, se
        row["verdict"] = verdict(None if mean is None else direction * mean, se, floor)
    if decided is not None:
        row["verdict"] = decided
    row["seeds"] = max((sum(x is not None for x in v) for v in per_model.values()), default=0)
    return row


def _per_seed(seeds: dict, read) -> dict:
    """`{model: [value of each seed, None where it has none]}` from `read(seed's
    analysis, seed's results, model)`; a model without any value is left out."""
    out = {model: [read(done["analysis"], done["results"], model) for done in seeds.values()]
           for model in ("dare", "twin", "din")}
    return {model: values for model, values in out.items() if any(v is not None for v in values)}


def _differences(values: dict) -> list:
    """DARE minus TWIN, seed by seed, over the seeds where both have a value."""
    return [d - t for d, t in zip(values.get("dare", []), values.get("twin", [])) if d is not None and t is not None]


def _representation(seeds: dict) -> dict:
    """AMI over the k sweep: DARE minus TWIN per k, each k's mean over the seeds."""
    by_k = {}
    for done in seeds.values():
        mi = done["analysis"]["representation"]["mutual_information"]
        for k in mi["dare"]:
            by_k.setdefault(int(k), []).append(mi["dare"][k] - mi["twin"][k])
    per_k = {k: mean_se(v) for k, v in sorted(by_k.items())}
    verdicts = [verdict(m, s) for m, s in per_k.values()]
    decided = ("holds" if all(v == "holds" for v in verdicts) else
               "does not reproduce" if all(v == "does not reproduce" for v in verdicts) else "not distinguishable")
    best = _per_seed(seeds, lambda a, r, m: max(a["representation"]["mutual_information"][m].values())
                     if m in a["representation"]["mutual_information"] else None)
    above = sum(v == "holds" for v in verdicts)
    below = sum(v == "does not reproduce" for v in verdicts)
    return _row("representation: k-means clusters explain the label", "largest AMI over the k sweep "
                f"(k {min(per_k)} to {max(per_k)}); verdict over every k: DARE above TWIN beyond 2 SE at {above} "
                f"of {len(per_k)} k, below at {below}", "DARE higher than TWIN", best, decided=decided)


def claims(seeds: dict, paper_auc: dict) -> list[dict]:
    """Every claim set beside the paper's, from `{seed: {"analysis": ..., "results": {model: ...}}}`."""
    rows = []
    auc = _per_seed(seeds, lambda a, r, m: r[m]["test"]["auc"])
    rows.append(_row("test AUC", "test AUC of each seed's run (best validation weights)",
                     " / ".join(f"{m.upper()} {paper_auc[m]}" for m in ("dare", "twin", "din")), auc,
                     _differences(auc)))
    paper = _per_seed(seeds, lambda a, r, m: (a["retrieval"]["paper"]["ndcg"] or {}).get(m))
    rows.append(_row("search stage against the MI truth", "the paper's: NDCG@20 over the paper's population "
                     "(the table above), DARE and TWIN ranked by the category-and-time part of their score, DIN by "
                     "its attention", " / ".join(f"{m.upper()} {PAPER['ndcg'][m]}" for m in ("dare", "twin", "din")),
                     paper, _differences(paper)))
    own = _per_seed(seeds, lambda a, r, m: a["retrieval"]["ndcg"].get(m))
    k = next(iter(seeds.values()))["analysis"]["retrieval"]["k"]["dare"]
    rows.append(_row("search stage against the MI truth", f"the package's: NDCG@{k} over every test example whose "
                     "target category has >= 50 training examples, each model's full search score",
                     "(not reported)", own, _differences(own)))
    spearman = _per_seed(seeds, lambda a, r, m: a["attention"]["rank_correlation"].get(m))
    rows.append(_row("learned attention matches the MI truth", "Spearman correlation of the category-position "
                     "scores with the MI, most frequent target categories", "DARE matches, TWIN does not",
                     spearman, _differences(spearman)))
    gradients = [("the paper's: mean row norm of each path over the first 100 steps, their ratio",
                  lambda g: g["paper"]["norm_ratio"]),
                 ("the package's: median over the run of the whole-matrix norm ratio", lambda g: g["norm_ratio"])]
    for statistic, read in gradients:
        ratio = _per_seed(seeds, lambda a, r, m, read=read: read(a["gradients"]["by_model"][m])
                          if m in a["gradients"]["by_model"] else None)
        mean, se = mean_se(ratio.get("twin", []))
        rows.append(_row("gradient domination (representation / attention)", statistic + "; fresh 100-step runs "
                         "of TWIN at batch 2048, learning rate 0.01; verdict: TWIN's "
                         "within 2x of the paper's, as report.md reads it", f"about {PAPER['norm_ratio']:g}x (TWIN)",
                         ratio, decided=within(mean, se, PAPER["norm_ratio"] / 2, PAPER["norm_ratio"] * 2)))
    conflicts = [("the paper's: share of the first 100 steps (and up to 1,000 spread) with a negative mean "
                  "per-row cosine", lambda g: g["paper"]["conflict_share"]),
                 ("the package's: share of 21 steps spread over the run", lambda g: g["conflict_share"])]
    for statistic, read in conflicts:
        share = _per_seed(seeds, lambda a, r, m, read=read: read(a["gradients"]["by_model"][m])
                          if m == "twin" else None)
        mean, se = mean_se(share.get("twin", []))
        low, high = PAPER["conflict_share"]
        rows.append(_row("gradient conflict (TWIN)", statistic + "; verdict: most steps conflicting",
                         f"{low:.0%}-{high:.0%} of cases", share,
                         decided=verdict(None if mean is None else mean - 0.5, se)))
    rows.append(_representation(seeds))
    steps = _per_seed(seeds, lambda a, r, m: a["convergence"]["steps_to_reference_best"].get(m))
    reached = "; ".join(f"{m.upper()} in {sum(v is not None for v in steps.get(m, []))} of {len(seeds)} seeds"
                        for m in ("dare", "twin"))
    rows.append(_row("convergence", "training steps to reach TWIN's best validation AUC over all seeds "
                     f"(validation every {VALIDATION_INTERVAL} steps); reached by {reached}; the difference over "
                     "the seeds where both reach it", "DARE ~450, TWIN ~1,300 (Tmall)", steps,
                     _differences(steps), direction=-1, floor=VALIDATION_INTERVAL, digits=0))
    return rows


def population(spec: dict, fraction: float, seeds: dict) -> list[dict]:
    """The log and how many test examples each NDCG population keeps."""
    analysis = next(iter(seeds.values()))["analysis"]
    paper = analysis["retrieval"]["paper"]["population"]
    return [{"log": f"data.synthetic --like=taobao --fraction={fraction:g}", "rows": spec["source"]["rows"],
             "users": spec["num_users"], "users_kept": spec["users"], "items": spec["num_items"],
             "categories": spec["num_categories"],
             "train_examples": spec["counts"]["train"], "test_examples": paper["test_examples"],
             "frequent_target": paper["frequent_target"], "paper_population": paper["kept"],
             "max_thin": paper["max_thin"], "package_population": analysis["retrieval"]["examples"],
             "seeds": len(seeds)}]


def dimension_cut(seeds: dict) -> list[dict]:
    """DARE's attention-dimension cut over the seeds: per attention width, test AUC and
    its difference from the widest (paired by seed), and the search stage's time per
    example and its ratio to the widest's; "almost no AUC" holds where the drop is
    within two standard errors of 0."""
    widths = sorted({r["attention_dim"] for done in seeds.values() for r in done["dimensions"]["rows"]},
                    reverse=True)
    by_seed = [{r["attention_dim"]: r for r in done["dimensions"]["rows"]} for done in seeds.values()]
    rows = []
    for width in widths:
        auc = [s[width]["test_auc"] for s in by_seed if width in s]
        drop = [s[width]["test_auc"] - s[widths[0]]["test_auc"] for s in by_seed if width in s]
        ratio = [s[width]["search_us_per_example"] / s[widths[0]]["search_us_per_example"] for s in by_seed
                 if width in s]
        us = [s[width]["search_us_per_example"] for s in by_seed if width in s]
        mean, se = mean_se(drop)
        rows.append({"attention_dim": width, "representation_dim": by_seed[0][width]["representation_dim"],
                     "test_auc": _cell(*mean_se(auc)), f"auc_minus_width_{widths[0]}": _cell(mean, se),
                     "search_us_per_example": _cell(*mean_se(us), 2),
                     f"search_time_over_width_{widths[0]}": _cell(*mean_se(ratio), 2),
                     "almost_no_auc": "" if width == widths[0] else
                     {True: "costs AUC", False: "gains AUC", WITHIN_NOISE: "holds (within noise)", None: ""}[
                         None if se is None else compared(-mean, 2 * se)],
                     "seeds": len(auc)})
    return rows
