"""Thin absl programs. Their flags are defined and parsed before TensorFlow
loads (`--help` and a bad flag answer at once): `dare_tf` defers its imports
until `dare_tf.cli.run` has parsed them. Quiet by default: TensorFlow's C++
INFO and WARNING lines are off unless TF_CPP_MIN_LOG_LEVEL says otherwise, and
absl's INFO lines unless --verbosity asks."""

import os as _os
import sys as _sys

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet: no TensorFlow C++ INFO or WARNING lines
if "dare_tf" not in _sys.modules:
    _os.environ["DARE_TF_DEFER_IMPORTS"] = "1"  # consumed by `import dare_tf`
