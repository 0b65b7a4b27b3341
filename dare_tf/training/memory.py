"""What a training step needs in memory and what this process has: the check made
before anything is built (`check_step_memory`), and the one-line error of a step
that runs out of memory all the same (`out_of_memory`), for both engines."""

from __future__ import annotations

import os
import re

from dare_tf.model.config import ModelConfig


# Bytes a training step holds per history slot of its batch and per float of a behaviour's
# embeddings (every table's vector, its gradient and the activations between): measured peak RSS
# of DARE at d=16 (96 floats a behaviour), batch 32 and 64, L 20,000 to 140,000 on CPU: 660-750
# bytes a slot, which 8 bytes a float and 64 for the slot's ids bound from above.
STEP_BYTES_PER_FLOAT, STEP_BYTES_PER_SLOT = 8, 64
# Under an address-space limit (RLIMIT_AS), the room a process keeps besides the step's histories
# and what it holds: new threads' stacks, the allocator's arenas, XLA's compiler threads. Measured
# (DARE at d 8 and 4, L 20,000, batch 256: 2.4 GiB estimated, 1.5 GiB held at the check): with
# 1.0 to 1.1 GiB left above both, the step's tensors fitted and a thread's creation then failed
# (`LLVM ERROR: pthread_create failed`, or an uncaught `std::bad_alloc`): an abort, not a line.
ADDRESS_SPACE_HEADROOM = 5 * 2**30 // 4


def step_bytes(model_config: ModelConfig, batch_size: int) -> int:
    """An upper estimate of what one training step holds for its histories."""
    floats = model_config.attention_width + model_config.representation_width
    return batch_size * model_config.max_len * (STEP_BYTES_PER_FLOAT * floats + STEP_BYTES_PER_SLOT)


def memory_limit() -> tuple[int, str]:
    """This process's memory and what sets it: the smallest of the machine's memory,
    its control group's limit (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`)
    and the process's address-space limit (`RLIMIT_AS`, `ulimit -v`)."""
    import resource

    limits = [(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory")]
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            limits.append((int(limit), f"the control group's limit ({path})"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, "this process's address-space limit (RLIMIT_AS, ulimit -v)"))
    return min(limits, key=lambda limit: limit[0])


def memory_bytes() -> int:
    """This process's memory: the smallest of `memory_limit`'s."""
    return memory_limit()[0]


def process_bytes(address_space: bool) -> int:
    """What this process holds now (Linux's /proc; 0 where it does not say): its address
    space (`VmSize`, what an address-space limit counts) or its resident memory (`VmRSS`)."""
    key = "VmSize:" if address_space else "VmRSS:"
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(key)), 0)
    except OSError:
        return 0


def check_step_memory(model_config: ModelConfig, batch_size: int, available: int | None = None) -> None:
    """Refuses, before anything is built, a history length and batch whose training
    step cannot fit in this process's memory (`memory_limit`, less what the process
    holds already, `process_bytes`: it ended in an internal reshape error, or was
    killed, or aborted in the allocator; under an address-space limit, less
    `ADDRESS_SPACE_HEADROOM` too)."""
    need = step_bytes(model_config, batch_size)
    if available is None:
        available, what = memory_limit()
        address_space = "RLIMIT_AS" in what
        held = process_bytes(address_space)
    else:
        what, held, address_space = "this machine's memory", 0, False
    room = ADDRESS_SPACE_HEADROOM if address_space else 0
    if need + held + room > available:
        besides = f", less the {held / 2**30:.1f} GiB this process holds already" if held else ""
        if room:
            besides += f"{' and' if held else ', less'} {room / 2**30:.2f} GiB for its threads"
        raise ValueError(f"max_len={model_config.max_len} at batch_size={batch_size}: one training step holds about "
                         f"{need / 2**30:.1f} GiB for its histories ({batch_size} x {model_config.max_len:,} slots of "
                         f"{need // (batch_size * model_config.max_len):,} bytes), more than {what}, "
                         f"{available / 2**30:.1f} GiB{besides}; lower --max_len or --batch_size")


class OutOfMemoryError(ValueError):
    """A training step that ran out of memory; the program ends at once after its line
    (`exit_at_once`: a runtime whose allocation failed may crash while torn down)."""

    exit_at_once = True


def out_of_memory(model_config: ModelConfig, batch_size: int, error: BaseException) -> OutOfMemoryError:
    """The one-line error of a training step that ran out of memory all the same
    (`check_step_memory` estimates; the allocator decides), on either backend: the
    allocator's own line where the error holds one."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    said = next((line for line in lines if re.search(r"OOM when allocating|Out of memory|RESOURCE_EXHAUSTED", line)),
                lines[0])
    return OutOfMemoryError(f"max_len={model_config.max_len} at batch_size={batch_size}: the training step ran out "
                            f"of memory ({type(error).__name__}: {said[:200]}); lower --max_len or --batch_size")


__all__ = ["ADDRESS_SPACE_HEADROOM", "OutOfMemoryError", "check_step_memory", "memory_bytes", "memory_limit",
           "out_of_memory", "process_bytes", "step_bytes"]
