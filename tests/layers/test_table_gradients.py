import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dare_tf.layers import table_gradients
from dare_tf.layers.table_gradients import MODES, table_gradient_mode


def numpy_gradient(rows, ids, cotangent):
    """The table's gradient of `sum(take(table, ids) * cotangent)`, one row at a time."""
    grad = np.zeros((rows, cotangent.shape[-1]), np.float64)
    for i, c in zip(ids.reshape(-1), cotangent.reshape(-1, cotangent.shape[-1]), strict=True):
        if -rows <= i < rows:
            grad[i % rows] += c
    return grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", [7, 300])  # fewer rows than lookups (sorted), and more
def test_gradient_sums_each_rows_cotangents_in_every_mode(rng, mode, rows):
    table = rng.normal(size=(rows, 3)).astype("float32")
    ids = rng.integers(-rows, rows + 2, (6, 20)).astype("int32")  # negative ids wrap; past the end: none
    ids[0, :5] = 2  # a popular row
    cotangent = rng.normal(size=(6, 20, 3)).astype("float32")

    def loss(t):
        return jnp.sum(jnp.nan_to_num(table_gradients.take(t, ids)) * cotangent)

    with table_gradient_mode(mode):
        values = jax.jit(lambda t: table_gradients.take(t, ids))(table)
        grad = jax.jit(jax.grad(loss))(table)
    np.testing.assert_array_equal(values, jnp.take(table, ids, axis=0))  # the forward is jnp.take's
    np.testing.assert_allclose(grad, numpy_gradient(rows, ids, cotangent), rtol=1e-5, atol=1e-5)


def test_an_unknown_mode_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^table_gradient_mode: 'fast' is not one of \('xla', 'materialized', "
                                         r"'sorted', 'sorted_all', 'privatized'\)$"):
        with table_gradient_mode("fast"):
            pass


def test_sorted_mode_sorts_only_where_lookups_outnumber_rows():
    ids = jnp.zeros((4, 5), jnp.int32)
    cotangent = jnp.ones((4, 5, 2))

    def sorts(rows):
        with table_gradient_mode("sorted"):
            jaxpr = jax.make_jaxpr(jax.grad(lambda t: jnp.sum(table_gradients.take(t, ids) * cotangent)))(
                jnp.zeros((rows, 2)))
        return " sort[" in str(jaxpr)

    assert sorts(10) and not sorts(30)  # 20 lookups


def test_the_default_mode_is_the_platforms():
    assert jax.default_backend() == "cpu"
    assert table_gradients.current_mode() == "xla"  # a sort costs a CPU more than it saves
    with table_gradient_mode("sorted_all"):
        assert table_gradients.current_mode() == "sorted_all"
    assert table_gradients.DEFAULT_MODE == {"gpu": "privatized"}


@pytest.mark.parametrize("mode", MODES)
def test_slots_are_take_along_axis_with_its_gradient(rng, mode):
    values = rng.normal(size=(3, 8, 2, 4)).astype("float32")
    positions = np.stack([rng.permutation(8)[:5] for _ in range(3)]).astype("int32")
    cotangent = rng.normal(size=(3, 5, 2, 4)).astype("float32")
    reference = jnp.take_along_axis(values, positions[:, :, None, None], axis=1)

    def loss(v):
        return jnp.sum(table_gradients.take_slots(v, positions) * cotangent)

    with table_gradient_mode(mode):
        np.testing.assert_array_equal(table_gradients.take_slots(values, positions), reference)
        grad = jax.grad(loss)(values)
    expected = np.zeros_like(values)
    for b in range(3):
        expected[b, positions[b]] += cotangent[b]
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
