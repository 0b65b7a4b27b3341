"""Baseline for bench_prepare: the paper's preprocessing algorithm in pure Python.

Written from the description of the reference script (reference.md, "Data
protocol"): two passes over the log with dicts and lists, `random.choices`
for frequency-weighted negatives, membership tests on the user's click list,
deep-copied padded histories, and object arrays saved with `np.save`. It
exists only to be timed against `data.prepare`.

Usage: python benchmarks/reference_prepare.py INPUT OUTPUT_DIR
"""

import copy
import os
import random
import sys
from collections import Counter

import numpy as np


def pad_and_truncate(seq, max_len=200):
    seq = copy.deepcopy(seq)
    if len(seq) < max_len:
        seq = [0] * (max_len - len(seq)) + seq
    return seq[-max_len:]


def main(path, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    uid_map, iid_map, cid_map = {}, {}, {}
    with open(path) as f:
        for line in f:
            uid, iid, cid, btype, _ = line.split(",")
            if btype != "pv":
                continue
            uid, iid, cid = int(uid), int(iid), int(cid)
            uid_map.setdefault(uid, len(uid_map) + 1)
            iid_map.setdefault(iid, len(iid_map) + 1)
            cid_map.setdefault(cid, len(cid_map) + 1)
    hist_i, hist_c, iid_2_cid, all_iid = {}, {}, {}, []
    with open(path) as f:
        for line in f:
            uid, iid, cid, btype, _ = line.split(",")
            if btype != "pv":
                continue
            uid, iid, cid = uid_map[int(uid)], iid_map[int(iid)], cid_map[int(cid)]
            iid_2_cid[iid] = cid
            hist_i.setdefault(uid, []).append(iid)
            hist_c.setdefault(uid, []).append(cid)
            all_iid.append(iid)
    counter = Counter(all_iid)
    population, weights = list(counter.keys()), list(counter.values())
    pool = random.choices(population, weights, k=100000)
    idx = 0
    splits = {"train": [], "val": [], "test": []}
    for uid in hist_i:
        if idx > 99000:
            pool, idx = random.choices(population, weights, k=100000), 0
        items, cats = hist_i[uid], hist_c[uid]
        if len(items) < 210:
            continue
        targets = [("train", k) for k in range(3, 94, 5)] + [("val", 2), ("test", 1)]
        for split, k in targets:
            hi, hc = pad_and_truncate(items[:-k]), pad_and_truncate(cats[:-k])
            splits[split].append([uid, items[-k], cats[-k], [1, 0], hi, hc])
            for _ in range(2):
                neg = pool[idx]
                idx += 1
                while neg in items:
                    neg = pool[idx]
                    idx += 1
                splits[split].append([uid, neg, iid_2_cid[neg], [0, 1], pad_and_truncate(items[:-k]),
                                      pad_and_truncate(cats[:-k])])
    random.shuffle(splits["train"])
    for i in range(0, len(splits["train"]), 102400):
        np.save(os.path.join(out_dir, f"train_{i // 102400:04d}.npy"),
                np.asarray(splits["train"][i:i + 102400], dtype=object))
    for split in ("val", "test"):
        np.save(os.path.join(out_dir, f"{split}.npy"), np.asarray(splits[split], dtype=object))
    print({k: len(v) for k, v in splits.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
