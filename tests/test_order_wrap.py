"""symgrad.torch.wrap and symgrad.jax.wrap of a loaded order-statistic module (issue 29, loose
end 1): the NumPy or cpu backend's module whose forward returns (values, indices) runs as a
framework function returning both, the indices integers without a gradient, against the
wrapped module itself (checked against brute force and the frameworks in test_order.py and
test_median.py): the same values and indices, bit for bit, and its backward as the gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from conftest import same_values

X = np.array([[5.0, 5.0, 5.0, 1.0, -0.0, 0.0], [2.0, np.nan, 2.0, 1.0, np.inf, 2.0], [3.0, 1.0, 3.0, 3.0, -1.0, 0.5]],
             dtype=np.float32)
G_SEED = 7
# (op, params, settings): a rank body, a prefix body, one rank per row (tie blocks), and a
# median over every element (one output, no indices: the function returns the values alone)
CASES = [("topk", {"k": 2, "dim": -1}, {"ties": "first"}), ("cummax", {"dim": 0}, {"convention": "torch"}),
         ("kthvalue", {"k": 2, "dim": 1}, {"ties": "split"}), ("median", {}, {"convention": "torch"})]


def _expected(module, g):
    output, saved = module.forward(X)
    return output, module.backward(g, saved)[0]


def _grad_output(module):
    output, _ = module.forward(X)
    values = output[0] if isinstance(output, tuple) else output
    return np.random.default_rng(G_SEED).standard_normal(values.shape).astype(values.dtype)


# the default run: topk and the median's single output on the NumPy module; -m slow the others
# (each cpu module compiles its library: a second or more)
DEFAULT = {("topk", "numpy"), ("median", "numpy")}


@pytest.mark.parametrize("name,params,settings,backend", [
    pytest.param(*c, b, marks=() if (c[0], b) in DEFAULT else pytest.mark.slow, id=f"{c[0]}-{b}")
    for c in CASES for b in ("numpy", "cpu")])
def test_torch_wrap_returns_values_and_indices(name, params, settings, backend):
    torch = pytest.importorskip("torch")
    import symgrad.torch as st
    module = symgrad.load(name, backend=backend, **settings, **params)
    g = _grad_output(module)
    expected, grad = _expected(module, g)
    fn = st.wrap(module)
    x = torch.tensor(X, requires_grad=True)
    got = fn(x)
    if isinstance(expected, tuple):
        values, indices = got
        assert indices.dtype == torch.int64 and not indices.requires_grad
        assert np.array_equal(indices.numpy(), expected[1])
        expected = expected[0]
    else:
        assert isinstance(got, torch.Tensor)
        values = got
    assert same_values(values.detach().numpy(), expected)
    values.backward(torch.from_numpy(g))
    assert same_values(x.grad.numpy(), grad)
    with torch.no_grad():  # no graph: the same outputs
        again = fn(x)
    assert same_values((again[0] if isinstance(again, tuple) else again).numpy(), expected)


@pytest.mark.parametrize("name,params,settings", [
    pytest.param(*c, marks=pytest.mark.slow) for c in CASES], ids=[c[0] for c in CASES])  # (JAX compiles: seconds)
def test_jax_wrap_returns_values_and_indices(name, params, settings):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import symgrad.jax as sj
    module = symgrad.load(name, **settings, **params)
    g = _grad_output(module)
    expected, grad = _expected(module, g)
    fn = sj.wrap(module)
    got = fn(jnp.asarray(X))
    if isinstance(expected, tuple):
        values, indices = got
        assert jnp.issubdtype(indices.dtype, jnp.integer)
        assert np.array_equal(np.asarray(indices), expected[1])
        expected = expected[0]
    else:
        values = got
    assert same_values(np.asarray(values), expected)

    def loss(x):
        out = fn(x)
        return jnp.sum((out[0] if isinstance(out, tuple) else out) * g)
    # the gradient of <values, g> is backward(g), up to the sum's rounding: g's exact multiples
    assert same_values(np.asarray(jax.grad(loss)(jnp.asarray(X))), grad)
