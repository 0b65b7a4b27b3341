"""Constants and helpers the training tests share."""

import os
import sys


# XLA is tested in tests/model/test_dare_model.py; graph mode keeps these runs short.
FAST = dict(batch_size=256, eval_batch_size=512, epochs=1, eval_every=40, learning_rate=0.005,
            model_overrides=dict(top_k=10), jit_compile=False, verbose=0)

TINY = dict(batch_size=256, eval_batch_size=1024, epochs=1, eval_every=5, max_steps=5, bn_statistics_batches=2,
            model_overrides=dict(top_k=5), verbose=0, jit_compile=False)


def train_args(data_dir, out) -> list[str]:
    """`trainers.train`'s flags of a short DARE run (30 steps)."""
    return ["--model=dare", f"--data_dir={data_dir}", f"--output_dir={out}", "--batch_size=128",
            "--eval_batch_size=512", "--epochs=2", "--eval_every=5", "--max_steps=30", "--top_k=10", "--nojit_compile",
            "--verbose=0"]


def train_command(data_dir, out) -> list[str]:
    """The same as a process's command line."""
    return [sys.executable, "-m", "trainers.train", *train_args(data_dir, out)]


def tensorboard_scalars(log_dir) -> dict:
    """`{tag: [(step, value)]}` of the scalars in the TensorBoard run `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


def tensorboard_hparams(log_dir) -> dict:
    """The hyperparameters a run wrote for TensorBoard's HParams dashboard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(log_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    return data.session_start_info.hparams


def files_held_open(run_dir) -> list[str]:
    """The files under `run_dir` this process still holds open (Linux's /proc/self/fd):
    after `train` returns, or fails, none (its TensorBoard event files closed, their
    writer threads ended)."""
    root = os.path.realpath(run_dir) + os.sep
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (the listing's own descriptor, closed since)
            continue
        if target.startswith(root):
            held.append(target[len(root):])
    return sorted(held)
