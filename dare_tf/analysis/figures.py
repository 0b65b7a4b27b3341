"""The analyses' figures (matplotlib, PNG), and the training curves a run writes."""

from __future__ import annotations

import os

import numpy as np

from dare_tf._faces import public


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["figure.constrained_layout.use"] = True  # labels, titles and legends never overlap
    return plt


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}.png"
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    os.replace(tmp, path)
    return path


@public("dare_tf.analysis")
def write_curves(run_dir: str) -> str:
    """`run_dir/curves.png` of a finished ranking run: training loss and validation
    metrics against steps, per seed (`training_curves`). Drawn by the trainer
    program (`trainers.train`); a library run draws its own with this."""
    from dare_tf.run_directory import CURVES, RunDirectory

    run = RunDirectory(run_dir)
    results = run.results()
    histories = {f"seed {s}": run.history(s) for s in results["seeds"]}
    return training_curves({k: v for k, v in histories.items() if v}, os.path.join(run_dir, CURVES),
                           curves_title(results["config"]["preset"], os.path.basename(os.path.normpath(run_dir))))


def curves_title(preset: str, run: str) -> str:
    """The preset, and the run directory's name when it says more (no "dare: dare")."""
    return preset if run in (preset, "") else f"{preset} ({run})"


def training_curves(history: dict[str, list[dict]], path: str, title: str) -> str:
    """Training loss and validation AUC and logloss against steps, one line per
    seed: `history` maps a seed's name to its `history.jsonl` entries."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, entries in history.items():
        steps = [h["step"] for h in entries]
        axes[0].plot(steps, [h.get("train_loss", np.nan) for h in entries], marker="o", label=name)
        axes[1].plot(steps, [h["val"]["auc"] for h in entries], marker="o", label=name)
        axes[2].plot(steps, [h["val"]["logloss"] for h in entries], marker="o", label=name)
    for ax, label in zip(axes, ("training loss (last batch)", "validation AUC", "validation logloss")):
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if len(history) > 1:
        axes[0].legend()
    if max((len(entries) for entries in history.values()), default=0) <= 1:
        title += "\n(one validation per seed, so no curve: validate more often with --eval_every)"
    fig.suptitle(title)
    return _save(fig, path)


def attention_heatmaps(truth: np.ndarray, learned: dict[str, np.ndarray], targets, categories, path: str) -> str:
    """Rows: target categories; columns: ground-truth MI, then each model's learned
    score (behaviour category x position); each panel min-max normalised, with
    a colour bar."""
    plt = _pyplot()
    cols = 1 + len(learned)
    fig, axes = plt.subplots(len(targets), cols, figsize=(3.2 * cols, 3.0 * len(targets)), squeeze=False)
    for r, target in enumerate(targets):
        panels = [("ground truth (MI)", truth[r])] + [(name, m[r]) for name, m in learned.items()]
        for c, (name, mat) in enumerate(panels):
            ax = axes[r][c]
            span = np.nanmax(mat) - np.nanmin(mat)
            shown = (mat - np.nanmin(mat)) / span if span > 0 else np.zeros_like(mat)
            image = ax.imshow(shown, cmap="Blues", aspect="auto", vmin=0, vmax=1)
            ax.set_title(f"{name}\ntarget category {target}", fontsize=9)
            ax.set_xlabel("position (1 = most recent)")
            ax.set_ylabel("behaviour category")
            ax.set_xticks(range(mat.shape[1]), [str(p + 1) for p in range(mat.shape[1])], fontsize=7)
            ax.set_yticks(range(len(categories)), [str(x) for x in categories], fontsize=7)
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="normalised")
    fig.suptitle("Attention accuracy: ground-truth correlation vs learned attention")
    return _save(fig, path)


def ndcg_bars(results: dict[str, dict[str, dict]], path: str, k_label: str) -> str:
    """Grouped bars of mean NDCG with 95% intervals: `results[truth][model]`."""
    plt = _pyplot()
    truths = list(results)
    models = sorted({m for r in results.values() for m in r})
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(models) * len(truths), 3.8))
    width = 0.8 / len(truths)
    for i, truth in enumerate(truths):
        means = [results[truth].get(m, {}).get("mean", np.nan) for m in models]
        low = [m - results[truth].get(n, {}).get("low", np.nan) for m, n in zip(means, models)]
        high = [results[truth].get(n, {}).get("high", np.nan) - m for m, n in zip(means, models)]
        ax.bar(np.arange(len(models)) + i * width, means, width, yerr=[low, high], capsize=3,
               label=f"against {truth}")
    ax.set_xticks(np.arange(len(models)) + width * (len(truths) - 1) / 2, models)
    ax.set_ylabel(f"NDCG@{k_label} (mean, 95% interval)")
    ax.set_ylim(0, 1)
    ax.set_title("Search-stage quality: each model's ranking of the history")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def retrieval_case(gains: np.ndarray, scores: dict[str, np.ndarray], path: str, title: str) -> str:
    """One example: ground-truth gain per history position (bars) and each model's
    score (lines, min-max normalised over the example's real slots)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6))
    positions = np.arange(len(gains), 0, -1)
    ax.bar(positions, gains / (gains.max() if gains.max() > 0 else 1), color="lightgray",
           label="ground truth (normalised)")
    for name, s in scores.items():
        span = s.max() - s.min()
        ax.plot(positions, (s - s.min()) / span if span > 0 else np.zeros_like(s), marker=".", lw=1, label=name)
    ax.set_xlabel("position in the history (1 = most recent)")
    ax.set_ylabel("normalised gain / score")
    ax.invert_xaxis()
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def gradient_conflict(summaries: dict[str, dict], path: str) -> str:
    """Left: norm ratio (representation / attention) over the run's trajectory
    (fraction of the run's steps), per model.
    Right: histogram of the mean per-category cosine per sampled step (models
    with shared tables), with the conflicting share."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, s in summaries.items():
        axes[0].plot(s["fractions"], s["norm_ratios"], marker=".",
                     label=f"{name}: median {s['norm_ratio']:.3g}, final {s['final_norm_ratio']:.3g}")
        if s.get("mean_cosines"):
            share = s["conflict_share"]
            axes[1].hist(s["mean_cosines"], bins=20, range=(-1, 1), alpha=0.6,
                         label=f"{name}: {100 * share:.0f}% negative")
    axes[0].axhline(1.0, color="gray", lw=0.8)
    axes[0].set_xlabel("fraction of the run's training steps")
    axes[0].set_ylabel("gradient norm ratio\nrepresentation / attention")
    axes[0].set_yscale("log")
    axes[0].set_title("Gradient domination")
    axes[0].legend()
    axes[1].axvline(0.0, color="red", lw=0.8)
    axes[1].set_xlabel("cosine of the two gradients (mean over categories)")
    axes[1].set_ylabel("sampled steps")
    axes[1].set_title("Gradient conflict (shared embeddings)")
    if any(s.get("mean_cosines") for s in summaries.values()):
        axes[1].legend()
    return _save(fig, path)


def conflict_by_category(shares: dict[int, float], counts: dict[int, int], path: str, title: str) -> str:
    plt = _pyplot()
    rows = sorted(shares, key=lambda r: -counts[r])[:20]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    ax.bar([str(r) for r in rows], [shares[r] for r in rows], label="one category's embedding row")
    ax.axhline(0.5, color="gray", lw=0.8)
    ax.set_xlabel("category (dense id; the 20 most often sampled)")
    ax.set_ylabel("share of steps with\nnegative cosine")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.text(0.01, 0.0, "Bars: per category row, the share of sampled steps where that row's representation and "
             "attention gradients point apart. The headline conflict share is another measure: the share of steps "
             "whose cosine, averaged over all rows, is negative; the two can disagree.", fontsize=7, wrap=True,
             va="top")
    ax.tick_params(axis="x", labelsize=7, rotation=60)
    return _save(fig, path)


def representation_information(curves: dict[str, dict[int, float]], path: str) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, curve in curves.items():
        ks = sorted(curve)
        ax.plot(ks, [curve[k] for k in ks], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("k-means clusters k")
    ax.set_ylabel("adjusted MI(cluster, label)")
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_title("Representation discriminability")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def convergence(curves: dict[str, dict], path: str) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, c in curves.items():
        axes[0].plot(c["steps"], c["auc"], marker=".", label=name)
        axes[1].plot(c["steps"], c["logloss"], marker=".", label=name)
    for ax, label in zip(axes, ("validation AUC", "validation logloss")):
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Convergence (mean over seeds)")
    return _save(fig, path)


def attention_dimensions(rows: list[dict], path: str) -> str:
    """Test AUC and the search stage's cost against the attention width, in two panels
    (on one plot with two y-axes, both rising lines would lie on top of each other)."""
    plt = _pyplot()
    rows = sorted(rows, key=lambda r: r["attention_dim"])
    dims = [r["attention_dim"] for r in rows]
    fig, (auc, cost) = plt.subplots(1, 2, figsize=(8, 3.4))
    auc.plot(dims, [r["test_auc"] for r in rows], marker="o", color="C0")
    auc.set_ylabel("test AUC")
    auc.set_title("quality")
    cost.plot(dims, [r["search_us_per_example"] for r in rows], marker="s", color="C1")
    cost.set_ylabel("search stage, us per example")
    cost.set_ylim(bottom=0)
    cost.set_title("search cost")
    for ax in (auc, cost):
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.set_xlabel("attention embedding width")
    fig.suptitle("Attention-dimension cut (DARE)")
    return _save(fig, path)
