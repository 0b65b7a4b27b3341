"""The retrieval stage ahead of the ranker: a two-tower candidate generator on
tensorflow-recommenders (TFRS), trained with `tfrs.tasks.Retrieval` and
evaluated with `tfrs.metrics.FactorizedTopK` against the whole catalogue.

TFRS 0.7.7 needs `tf.keras` to be Keras 2 (tf-keras): call `use_keras2()`
before TensorFlow is first imported (the programs do), or set
`TF_USE_LEGACY_KERAS=1` in the environment. Importing this package changes
nothing; its modules that need TFRS refuse, naming the fix, a `tf.keras` that
is not Keras 2. Keras 3 (`import keras`, every other dare_tf module) works in
the same process.
"""

from dare_tf._faces import face_of, lazy_face

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__))
