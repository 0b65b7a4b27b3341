"""Thin absl programs. Importing one changes nothing: each imports its flag and
config modules (no TensorFlow), so `--help` and a bad flag answer at once, and
`dare_tf.cli.run` loads TensorFlow once the flags are parsed, quietly: its C++
INFO and WARNING lines are off unless TF_CPP_MIN_LOG_LEVEL says otherwise, and
absl's INFO lines unless --verbosity asks."""
