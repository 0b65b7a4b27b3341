"""Constants and helpers the training tests share."""

import sys



# XLA is tested in tests/test_models.py; graph mode keeps these runs short.
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
