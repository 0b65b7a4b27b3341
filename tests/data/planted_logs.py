"""Small custom logs for the data tests: an impression log (CSV or TSV, header,
rows not in time order) and a Parquet click log without a category column."""

import numpy as np

from dare_tf.data.logs.formats import LogFormat
from dare_tf.data.preparation.protocol import Protocol


def impression_rows(seed: int = 0, users: int = 40, per_user: int = 30):
    """Rows `(user, item, category, time, label)` in a shuffled file order."""
    rng = np.random.default_rng(seed)
    item_category = rng.integers(1, 9, 300)
    rows = []
    for u in range(users):
        times = rng.choice(10_000, per_user, replace=False) + 1_700_000_000
        items = rng.integers(1, 300, per_user)
        labels = (rng.random(per_user) < 0.4).astype(int)
        rows += [(1000 + u, int(i), int(item_category[i]), int(t), int(y)) for i, t, y in zip(items, times, labels)]
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def impression_log(tmp_path, file_format: str = "csv", seed: int = 0):
    """`(LogFormat, path, Protocol)` of a planted impression log with a header."""
    sep = "," if file_format == "csv" else "\t"
    path = tmp_path / f"impressions-{seed}.{file_format}"
    lines = [sep.join(("visitor", "product", "cat", "ts", "clicked"))]
    lines += [sep.join(map(str, r)) for r in impression_rows(seed)]
    path.write_text("\n".join(lines) + "\n")
    fmt = LogFormat(name=file_format, file_format=file_format, header=True, columns=(
        ("user", "visitor"), ("item", "product"), ("category", "cat"), ("time", "ts"), ("label", "clicked")))
    return fmt, str(path), Protocol(min_clicks=3, partitions=3)


def parquet_clicks(tmp_path, users: int = 12, per_user: int = 40):
    """`(LogFormat, path, Protocol)` of a Parquet click log with an action column
    and no category column, in two row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    n = users * per_user
    table = pa.table({
        "user": np.repeat(np.arange(users) + 7, per_user).astype(np.int64),
        "item": rng.integers(1, 150, n).astype(np.int32),
        "event": rng.choice(["click", "view"], n, p=[0.8, 0.2]),
        "ts": np.tile(np.arange(per_user), users).astype(np.int64) + 100,
    })
    path = str(tmp_path / "clicks.parquet")
    pq.write_table(table, path, row_group_size=n // 2)
    fmt = LogFormat(name="parquet", file_format="parquet", columns=(
        ("user", "user"), ("item", "item"), ("action", "event"), ("time", "ts")), click="click")
    return fmt, path, Protocol(min_clicks=20, train_targets=2, partitions=2)
