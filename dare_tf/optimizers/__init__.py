"""The optimizers the trainers offer, by name, and their TensorFlow classes.

| name | class | updates |
|---|---|---|
| `adam` | `FusedAdam` | every row (Keras Adam, TensorFlow's fused kernel) |
| `lazy_adam` | `LazyAdam` | only the embedding rows in the batch |

This module owns the names (`OPTIMIZERS`, the trainers' `--optimizer`) and
imports no TensorFlow until a class is asked for; each class says which
embedding gradients it wants from the model (`sparse_gradients`).
These classes are TensorFlow's; the JAX trainer runs `adam` as `keras.optimizers.Adam` and
`lazy_adam` as that Adam kept to the rows a step read (`dare_tf.training.engines.jax.state`).
"""

from dare_tf._faces import face_of, lazy_face, public, public_names

# Name -> the class (in `dare_tf.optimizers.adam`).
OPTIMIZERS = {"adam": "FusedAdam", "lazy_adam": "LazyAdam"}


@public("dare_tf.training")
def make_optimizer(name: str, learning_rate: float):
    """The optimizer named `name` (`OPTIMIZERS`) with `learning_rate`."""
    from dare_tf.optimizers import adam

    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r}: expected one of {tuple(OPTIMIZERS)}")
    return getattr(adam, OPTIMIZERS[name])(learning_rate=learning_rate)


__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__))
__all__ = sorted([*__all__, "OPTIMIZERS", "make_optimizer"])


public_names("dare_tf.training", "OPTIMIZERS")
