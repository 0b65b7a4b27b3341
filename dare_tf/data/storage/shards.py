"""The prepared dataset's shards: how they are named (TensorFlow's
`NAME-0000k-of-0000P.tfrecord[.gz]`), which partition a user's records go to,
how they are compressed, and the blocks a training stream reads them in.
Pure Python (the partition hash imports numpy when called).
"""

from __future__ import annotations

import re

STORE_KIND = "store"
COMPRESSIONS = {"gzip": "GZIP", "none": ""}  # --compression -> tf.io / spec.json value
DEFAULT_SHUFFLE_BUFFER = 100_000  # examples a training input stream shuffles over (tf.data)
# A shuffled stream reads shards in blocks of STREAM_BLOCK records, parsed and shuffled as units, then
# permutes the examples of every STREAM_MIX_BLOCKS blocks (dare_tf.data.feeding.pipeline.shuffled_columns).
STREAM_BLOCK = 256
STREAM_MIX_BLOCKS = 16
SHARD_NAME = re.compile(r"(?P<kind>[a-z]+)(-(?P<tag>\d+))?-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord(\.gz)?")
# The example shards of a `--split=time` dataset: one per partition and time
# segment (a UTC day, cut at the windows' first times), named by the segment's
# first time (`dare_tf.data.preparation.days`); a split lists its segments' shards.
SEGMENT_KIND = "examples"


def shard_name(kind: str, index: int, count: int, compression: str, tag: int | None = None) -> str:
    """TensorFlow's shard naming: `train-00003-of-00016.tfrecord.gz`; with `tag`
    (a time), `examples-1512259200-00003-of-00016.tfrecord.gz`."""
    prefix = kind if tag is None else f"{kind}-{int(tag)}"
    return f"{prefix}-{index:05d}-of-{count:05d}.tfrecord{'.gz' if compression == 'GZIP' else ''}"


def is_shard_name(name: str) -> bool:
    """Whether `name` is named as preparation names its shards (`shard_name`)."""
    return SHARD_NAME.fullmatch(name) is not None


def shard_tag(name: str) -> int | None:
    """The time a shard's name carries (`shard_name`'s `tag`), or None."""
    m = SHARD_NAME.fullmatch(name)
    return None if m is None or m["tag"] is None else int(m["tag"])


def partition_of(uid, partitions: int):
    """The partition of dense user id(s) `uid`: a splitmix64 hash modulo
    `partitions`. Store shard k and shard k of every split hold partition k's
    users, so a worker that reads shards k reads its users' examples and
    histories and nothing else."""
    import numpy as np

    with np.errstate(over="ignore"):
        z = np.asarray(uid, np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(partitions)).astype(np.int64)
