"""Model and training flags shared by the trainer programs, and their translation to configs."""

from absl import flags

from dare_tf.training import OPTIMIZERS, STRATEGIES, TrainConfig

FLAGS = flags.FLAGS

flags.DEFINE_integer("embedding_dim", 16, "Item and category representation embedding width.")
flags.DEFINE_integer("position_dim", 16, "Position representation embedding width.")
flags.DEFINE_integer("attention_embedding_dim", None,
                     "Item and category attention embedding width (dare, twin_4e); default: embedding_dim.")
flags.DEFINE_integer("attention_position_dim", None, "Position attention embedding width; default: position_dim.")
flags.DEFINE_integer("top_k", 20, "Behaviours kept by the search stage.")
flags.DEFINE_integer("batch_size", 2048, "Global training batch size.")
flags.DEFINE_integer("eval_batch_size", 2048, "Evaluation batch size.")
flags.DEFINE_float("learning_rate", 0.01, "Adam learning rate.")
flags.DEFINE_integer("epochs", 2, "Passes over the training split.")
flags.DEFINE_list("seeds", ["0"], "Seeds; several give mean and std.")
flags.DEFINE_integer("eval_every", 150, "Steps between validation evaluations and checkpoints.")
flags.DEFINE_enum("optimizer", "adam", list(OPTIMIZERS), "adam (dense, reference) or lazy_adam (sparse rows).")
flags.DEFINE_bool("reference_mode", False,
                  "Reproduce the reference code's evaluation: BatchNorm batch statistics, last partial "
                  "batch dropped; N(0, 0.01) init.")
flags.DEFINE_enum("strategy", "default", list(STRATEGIES), "Distribution strategy.")
flags.DEFINE_integer("cpu_devices", 0, "Split the CPU into this many logical devices (for --strategy=mirrored).")
flags.DEFINE_bool("jit_compile", True, "Compile forward and backward passes with XLA.")
flags.DEFINE_integer("max_steps", None, "Stop each seed after this many steps.")
flags.DEFINE_integer("shuffle_buffer", 100_000, "Examples in the shuffle buffer.")
flags.DEFINE_integer("bn_statistics_batches", 30,
                     "Training batches run forward before each evaluation so that BatchNorm's moving "
                     "statistics match the current weights (0: off; unused with --reference_mode).")


def model_overrides() -> dict:
    out = dict(embedding_dim=FLAGS.embedding_dim, position_dim=FLAGS.position_dim, top_k=FLAGS.top_k)
    if FLAGS.attention_embedding_dim is not None:
        out["attention_embedding_dim"] = FLAGS.attention_embedding_dim
    if FLAGS.attention_position_dim is not None:
        out["attention_position_dim"] = FLAGS.attention_position_dim
    return out


def train_config(preset: str, **changes) -> TrainConfig:
    fields = dict(
        preset=preset, model_overrides=model_overrides(), batch_size=FLAGS.batch_size,
        eval_batch_size=FLAGS.eval_batch_size, learning_rate=FLAGS.learning_rate, epochs=FLAGS.epochs,
        seeds=tuple(int(s) for s in FLAGS.seeds), eval_every=FLAGS.eval_every, optimizer=FLAGS.optimizer,
        reference_mode=FLAGS.reference_mode, strategy=FLAGS.strategy, jit_compile=FLAGS.jit_compile,
        max_steps=FLAGS.max_steps, shuffle_buffer=FLAGS.shuffle_buffer,
        bn_statistics_batches=FLAGS.bn_statistics_batches)
    fields.update(changes)
    return TrainConfig(**fields)
