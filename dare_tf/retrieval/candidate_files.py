"""The retrieval run's candidates, written once for the rankers of its cascade.

`RUN/candidates-N.npz` holds, for every positive example of the dataset's
train, val and test splits (its user and click position), the first N merged
candidates of its history (dense item ids, in the retrieval order), as
`RetrievalStage.candidates` gives them. `train_retrieval` writes them at the
end of its run (`RetrievalConfig.cascade_candidates`; tensorflow-recommenders);
they are read with numpy alone, so a ranker trained in the cascade
(`dare_tf.training.reranking.Cascade`) reads the same candidates on either
engine, and none loads the towers again.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from dare_tf._faces import public
from dare_tf._files import atomic_npz
from dare_tf.data.storage.schema import HIST_CATEGORIES, HIST_ITEMS

FILE = "candidates-{}.npz"
SPLITS = ("train", "val", "test")


def candidates_path(run_dir: str, n: int) -> str:
    return os.path.join(run_dir, FILE.format(n))


def _keys(uid: np.ndarray, position: np.ndarray) -> np.ndarray:
    return (np.asarray(uid, np.int64) << 32) | np.asarray(position, np.int64)


def write_candidates(stage, store, run_dir: str, n: int) -> str:
    """Writes `run_dir/candidates-N.npz` of the finished retrieval `stage`
    (`RetrievalStage`) over the dataset's `store`: every positive of each split
    with its first `n` candidates. Returns the path."""
    stage.require_candidates(n, "--cascade_candidates")
    arrays = {}
    for split in SPLITS:
        columns = stage.splits[split].columns
        positive = columns["label"] > 0.5
        uid, position = columns["uid"][positive], columns["position"][positive]
        keys, first = np.unique(_keys(uid, position), return_index=True)  # (one history: one row)
        histories = dict(zip((HIST_ITEMS, HIST_CATEGORIES), store.windows(uid[first], position[first],
                                                                         stage.spec.max_len)))
        arrays[f"{split}_keys"] = keys
        arrays[f"{split}_candidates"] = stage.candidates(histories, n).astype(np.int32)
    path = candidates_path(run_dir, n)
    atomic_npz(path, arrays)
    return path


@public("dare_tf.retrieval")
def read_candidates(run_dir: str, n: int, split: str, uid, position, flag: str = "--retrieval_run") -> np.ndarray:
    """The first `n` candidates `[P, n]` (dense item ids, best first) the retrieval
    run `run_dir` wrote for the positives `uid`, `position` of `split`; one-line
    errors naming the file where it is missing, damaged or lacks one of them."""
    path = candidates_path(run_dir, n)
    if not os.path.exists(path):
        written = sorted(int(f[len("candidates-"):-len(".npz")]) for f in os.listdir(run_dir)
                         if f.startswith("candidates-") and f.endswith(".npz") and ".tmp-" not in f)
        raise FileNotFoundError(
            f"{flag}={run_dir}: no {os.path.basename(path)} (the run wrote the candidates of "
            f"{', '.join(map(str, written)) or 'no count'}): run python -m trainers.train_retrieval on it again with "
            f"its flags and --cascade_candidates={n} (it writes them without training again)")
    try:
        with np.load(path) as f:
            keys, table = f[f"{split}_keys"], f[f"{split}_candidates"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path}: not a readable candidates file ({type(e).__name__}); run python -m "
                         f"trainers.train_retrieval on {run_dir} again with --cascade_candidates={n}") from None
    wanted = _keys(uid, position)
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1) if len(keys) else np.zeros(len(wanted), np.int64)
    missing = np.flatnonzero(keys[at] != wanted) if len(keys) else np.arange(len(wanted))
    if len(missing):
        m = int(missing[0])
        raise ValueError(f"{path}: no candidates of the {split} positive of user {int(np.asarray(uid)[m])} at "
                         f"position {int(np.asarray(position)[m])} ({len(missing)} of {len(wanted)} missing): the "
                         "file is of another preparation of the dataset; run the retrieval again")
    return table[at].astype(np.int64)


__all__ = ["read_candidates"]
