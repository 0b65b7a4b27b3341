"""dare-tf: DARE and its baselines for long-sequence recommendation, in Keras 3.

Public API (everything else is private, by a leading underscore or by not
being listed here):

- `dare_tf.layers`: the Keras layers (any backend).
- `dare_tf.search`: the search stage's variants, one `BehaviorSearch`
  subclass each, and their registry (any backend).
- `dare_tf.DareModel`, `dare_tf.build_model`, `dare_tf.ModelConfig`, `dare_tf.BehaviorField`,
  `dare_tf.PRESETS`, `dare_tf.make_config`: the models (any backend), defined in
  the `dare_tf.model` package.
- `dare_tf.metrics`: exact AUC, GAUC, category AUC, logloss (numpy).
- `dare_tf.data`: schema and dataset spec (pure Python); preparation,
  synthetic logs and the tf.data pipeline (TensorFlow).
- `dare_tf.optimizers`: `FusedAdam`, `LazyAdam` (TensorFlow).
- `dare_tf.training`: `train`, `TrainConfig` and the callbacks (TensorFlow).
- `dare_tf.serving`: export, client, the stand-in test server (TensorFlow).

Importing `dare_tf` (or any of its packages) costs nothing and changes
nothing: each public name is declared once, where it is defined
(`dare_tf._faces.public`), the packages' tables are generated from those
declarations (`dare_tf._api`, by `python -m dare_tf._api_gen`), and a name is
imported from the module that defines it on first use; no environment
variable is read or set and no file descriptor is touched. A program
(`trainers`, `serving`, `data`) therefore defines and parses its flags before
TensorFlow loads, and `dare_tf.cli.run` then loads it with its start-up
notices filtered.

`import dare_tf.model.dare_model` (or any use of `dare_tf.DareModel`) registers the
model with Keras; `dare_tf.load()` registers every layer, search and (on
TensorFlow) optimizer, as loading a saved model of any preset needs.
"""

from dare_tf._faces import face_of as _face_of, lazy_face as _lazy_face

_SUBMODULES = ("data", "layers", "metrics", "model", "optimizers", "search", "training", "serving", "export",
               "retrieval", "analysis", "histories")


def load() -> None:
    """Registers every layer, search variant, the model and (TensorFlow backend)
    the optimizers with Keras, as loading a saved model of any preset needs:
    imports Keras (and so the backend) and those modules."""
    import keras

    from dare_tf import layers, search
    from dare_tf.model import dare_model  # noqa: F401

    layers.import_layers()
    search.import_variants()
    if keras.backend.backend() == "tensorflow":
        from dare_tf.optimizers import adam  # noqa: F401


_QUIET = []  # the open `FilteredStderr` of `quiet`


def quiet() -> None:
    """Loads TensorFlow (on its backend) with its C++ notices filtered out for the
    rest of the process (oneDNN, no CUDA driver on a CPU machine, ...: stderr then
    goes through a pipe, as in the programs); call it first in a script that would
    rather not see them. Every other line, errors too, still shows; `import
    dare_tf` alone loads nothing, prints nothing and touches no file descriptor."""
    import atexit

    from dare_tf._startup import FilteredStderr, import_tensorflow_quietly

    if not _QUIET:
        _QUIET.append(FilteredStderr().__enter__())
        atexit.register(_QUIET[0].__exit__, None, None, None)
    import_tensorflow_quietly()


__getattr__, __dir__, __all__ = _lazy_face(__name__, _face_of(__name__), _SUBMODULES)
__all__ = [*__all__, "load", "quiet"]

__version__ = "0.3.0"
