"""Thin absl programs. Their flags are defined and parsed before TensorFlow
loads (`--help` and a bad flag answer at once): `dare_tf` defers its imports
until `dare_tf.cli.run` has parsed them."""

import os as _os
import sys as _sys

if "dare_tf" not in _sys.modules:
    _os.environ["DARE_TF_DEFER_IMPORTS"] = "1"  # consumed by `import dare_tf`
