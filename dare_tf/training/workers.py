"""Which worker a process is and what it reads, from a strategy's cluster (a
`tf.distribute` strategy's resolver; anything without one is one process, as
the trainer on JAX is). No TensorFlow."""

from __future__ import annotations

from dare_tf._faces import public
from dare_tf.data.storage.spec import DatasetSpec


def task_id(strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(getattr(resolver, "task_id", 0) or 0)


def is_chief(strategy) -> bool:
    """The task that writes results: the only one, the `chief`, or worker 0 of a chief-less cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if not cluster:
        return True
    if "chief" in cluster:
        return resolver.task_type == "chief"
    return resolver.task_type == "worker" and resolver.task_id == 0


@public("dare_tf.training")
def worker_index(strategy) -> tuple[int, int]:
    """`(this worker's index, number of workers)` of a multi-worker cluster (chief
    first), `(0, 1)` for one process."""
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    tasks = [(kind, i) for kind in ("chief", "worker") for i in range(len(cluster.get(kind, [])))]
    if len(tasks) <= 1:
        return 0, 1
    return tasks.index((resolver.task_type, resolver.task_id)), len(tasks)


@public("dare_tf.training")
def worker_partitions(spec: DatasetSpec, worker: int, workers: int) -> list[int] | None:
    """The partitions (shard indices) worker `worker` of `workers` reads: every
    `workers`-th from its own index; None (all) for one process."""
    if workers == 1:
        return None
    if spec.partitions < workers:
        raise ValueError(f"the dataset has {spec.partitions} partitions but {workers} workers need at least one "
                         "each: prepare it again with --partitions >= the number of workers")
    return list(range(worker, spec.partitions, workers))
