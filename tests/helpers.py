"""Shared test helpers, in the style of keras-rs: serialization and saving round trips."""

import keras
import numpy as np
import pytest

tensorflow_only = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                     reason="needs the TensorFlow backend")


def _numpy(tree):
    return keras.tree.map_structure(lambda t: np.asarray(keras.ops.convert_to_numpy(t)), tree)


def assert_layer_serializes(layer, *inputs, **call_kwargs):
    """get_config round trip: the restored layer has the same config and, with the
    same weights, gives identical outputs on `inputs`."""
    expected = _numpy(layer(*inputs, **call_kwargs))
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    assert restored.get_config() == layer.get_config()
    restored(*inputs, **call_kwargs)  # build
    restored.set_weights(layer.get_weights())
    keras.tree.map_structure(np.testing.assert_array_equal, _numpy(restored(*inputs, **call_kwargs)), expected)
    return restored


def assert_model_saves(model, inputs, path, atol=1e-6):
    """`.keras` save and reload: same class and config, outputs allclose."""
    expected = _numpy(model(inputs))
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(model)
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(_numpy(loaded(inputs)), expected, atol=atol)
    return loaded
