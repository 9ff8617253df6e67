"""Forward mode: every generated module's jvp is the linear map whose transpose is its backward.

Oracles: the transpose identity <jvp(t), g> == <t, backward(g)> at ties (small-integer inputs, t
and g, so the sums are exact or nearly so, NaN, +-inf and +-0 included), and central finite
differences of forward away from ties.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from symgrad.policy import NAN_RULES, POLICIES

from conftest import ELEMENTWISE, WINDOWED, case_id, tie_free, tie_heavy

ADAPTIVE = [
    ("adaptive_max_pool1d", {"output_size": 3}, (2, 3, 8)),
    ("adaptive_max_pool2d", {"output_size": (3, 2)}, (2, 7, 5)),
    ("adaptive_max_pool3d", {"output_size": 2}, (1, 2, 3, 5, 4)),
]
REDUCTIONS = [("logsumexp", {"dim": -1}, (3, 5)), ("logsumexp", {"dim": (0, 2), "temperature": 0.5}, (2, 3, 4))]
UNPOOL = [("max_unpool1d", {"kernel_size": 2}, (2, 3, 4)), ("max_unpool2d", {"kernel_size": 2}, (2, 3, 3)),
          ("max_unpool3d", {"kernel_size": 2}, (1, 2, 2, 2, 2))]
EXPRESSIONS = [
    ("Max(x, y, 0) - Min(x, 2*y)", ["x", "y"], True),
    ("Max(x*y, 0) + abs(x)", ["x", "y"], False),
    ("Heaviside(x)*y + Max(x, 1)", ["x", "y"], False),
    ("Max(x, -x, 0.5)", ["x"], True),
]
SPECIALS = [" ", "nan", "inf", "-inf", "-0"]  # values sprinkled into the tie-heavy inputs


def _special(rng, x, fraction=0.15):
    """x with some elements replaced by NaN, +-inf or -0.0."""
    x = x.copy()
    where = rng.random(x.shape) < fraction
    x[where] = rng.choice([np.nan, np.inf, -np.inf, -0.0], size=int(where.sum()))
    return x


def _ints(rng, shape):
    return rng.integers(-3, 4, size=shape).astype(np.float64)


def _inner(a, b) -> float:
    return float(np.sum(np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)))


def _assert_transposed(module, inputs, rng, float_inputs=None):
    """<jvp(t), g> == <t, backward(g)> for random small-integer t and g."""
    output, saved = module.forward(*inputs)
    float_inputs = float_inputs if float_inputs is not None else [True] * len(inputs)
    for _ in range(3):
        g = _ints(rng, output.shape)
        ts = [_ints(rng, np.shape(x)) if f else None for x, f in zip(inputs, float_inputs)]
        tangent = module.jvp(*ts, saved)
        assert tangent.shape == output.shape and tangent.dtype == output.dtype
        grads = module.backward(g, saved)
        left = _inner(tangent, g)
        right = sum(_inner(t, gr) for t, gr in zip(ts, grads) if t is not None)
        if np.isnan(left) or np.isnan(right):
            assert np.isnan(left) and np.isnan(right), (left, right)
        else:
            assert left == pytest.approx(right, rel=1e-12, abs=1e-12)


def _assert_fd(module, inputs, rng, eps=1e-6):
    output, saved = module.forward(*inputs)
    ts = [rng.standard_normal(np.shape(x)) for x in inputs]
    tangent = module.jvp(*ts, saved)
    plus = module.forward(*[x + eps * t for x, t in zip(inputs, ts)])[0]
    minus = module.forward(*[x - eps * t for x, t in zip(inputs, ts)])[0]
    np.testing.assert_allclose(tangent, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op, params, shapes", ELEMENTWISE, ids=[case_id(*c) for c in ELEMENTWISE])
@pytest.mark.parametrize("ties", POLICIES)
def test_elementwise_transpose_at_ties(op, params, shapes, ties):
    rng = np.random.default_rng(0)
    module = symgrad.load(op, ties=ties, **params)
    inputs = [_special(rng, tie_heavy(rng, s, levels=4) - 1) for s in shapes]
    _assert_transposed(module, inputs, rng)
    assert module.PIECEWISE_LINEAR is True


@pytest.mark.parametrize("op, params, shape", WINDOWED + ADAPTIVE, ids=[case_id(*c) for c in WINDOWED + ADAPTIVE])
@pytest.mark.parametrize("ties", POLICIES)
def test_window_transpose_at_ties(op, params, shape, ties):
    rng = np.random.default_rng(1)
    module = symgrad.load(op, ties=ties, **params)
    _assert_transposed(module, [tie_heavy(rng, shape)], rng)
    _assert_transposed(module, [_special(rng, tie_heavy(rng, shape))], rng)
    assert module.PIECEWISE_LINEAR is True


@pytest.mark.parametrize("nan", sorted(NAN_RULES))
@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op, params, shape", [
    ("maximum", {}, [(3, 4), (4,)]), ("relu", {}, [(5, 4)]),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, [(2, 7, 7)]),
    ("maxout", {"pieces": 3}, [(2, 6)]), ("amax", {"dim": 1}, [(3, 4, 2)]),
    ("adaptive_max_pool2d", {"output_size": 3}, [(2, 5, 7)]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_nan_rules_transpose(op, params, shape, ties, nan):
    rng = np.random.default_rng(2)
    try:
        module = symgrad.load(op, ties=ties, nan=nan, **params)
    except ValueError:
        pytest.skip(f"{op} does not take the NaN rule {nan!r} under {ties!r}")
    for _ in range(2):
        _assert_transposed(module, [_special(rng, tie_heavy(rng, s), 0.3) for s in shape], rng)


@pytest.mark.parametrize("convention", ["torch", "jax"])
@pytest.mark.parametrize("op, params, shapes", [
    ("maximum", {}, [(3, 4), (3, 4)]), ("clamp", {"min": -1.0, "max": 1.0}, [(4, 5)]),
    ("abs", {}, [(6,)]), ("amax", {}, [(3, 4)]),
    ("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, [(2, 3, 9)]),
    ("max_pool2d", {"kernel_size": 2, "stride": 1}, [(2, 2, 5, 5)]),
    ("adaptive_max_pool1d", {"output_size": 3}, [(2, 3, 8)]),
    ("max_unpool2d", {"kernel_size": 2}, None), ("logsumexp", {"dim": -1}, [(3, 5)]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_presets_transpose(op, params, shapes, convention):
    rng = np.random.default_rng(3)
    try:
        module = symgrad.load(op, convention=convention, **params)
    except ValueError:
        pytest.skip(f"{op} has no {convention} preset here")
    if op.startswith("max_unpool"):
        inputs, floats = _unpool_inputs(rng, (2, 3, 3), 2), [True, False]
    else:
        inputs, floats = [_special(rng, tie_heavy(rng, s)) for s in shapes], None
    _assert_transposed(module, inputs, rng, floats)


def _unpool_inputs(rng, shape, d, duplicates=True):
    """Pooled values and flat per-plane indices into an output of twice the spatial size, with
    repeated indices (several writers of one slot) when asked."""
    size = int(np.prod([2 * n for n in shape[-d:]]))
    high = max(1, size // 3) if duplicates else size
    indices = rng.integers(0, high, size=shape)
    return [tie_heavy(rng, shape), indices]


@pytest.mark.parametrize("op, params, shape", UNPOOL, ids=[case_id(*c) for c in UNPOOL])
@pytest.mark.parametrize("ties", POLICIES)
def test_unpool_transpose_with_repeated_indices(op, params, shape, ties):
    rng = np.random.default_rng(4)
    try:
        module = symgrad.load(op, ties=ties, **params)
    except ValueError:
        pytest.skip(f"{op} has no policy {ties!r}")
    d = int(op[-2])
    _assert_transposed(module, _unpool_inputs(rng, shape, d), rng, [True, False])
    with pytest.raises(ValueError, match="tangent_indices"):
        module.jvp(np.zeros(shape), np.zeros(shape), module.forward(*_unpool_inputs(rng, shape, d))[1])


@pytest.mark.parametrize("op, params, shape", REDUCTIONS, ids=[case_id(*c) for c in REDUCTIONS])
def test_logsumexp_jvp(op, params, shape):
    rng = np.random.default_rng(5)
    module = symgrad.load(op, **params)
    assert module.PIECEWISE_LINEAR is False
    _assert_transposed(module, [tie_heavy(rng, shape)], rng)
    _assert_fd(module, [rng.standard_normal(shape)], rng)


@pytest.mark.parametrize("text, inputs, linear", EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
@pytest.mark.parametrize("ties", POLICIES)
def test_expression_jvp(text, inputs, linear, ties):
    rng = np.random.default_rng(6)
    module = symgrad.load_expr(text, inputs=inputs, ties=ties)
    assert module.PIECEWISE_LINEAR is linear
    _assert_transposed(module, [tie_heavy(rng, (4, 5), levels=4) - 1 for _ in inputs], rng)
    _assert_fd(module, [tie_free(rng, (4, 5)) * 3 for _ in inputs], rng)


def test_expression_jvp_only_for_wrt():
    module = symgrad.load_expr("Max(x*y, 0)", inputs=["x", "y"], wrt=["x"])
    x, y = np.array([1.0, -2.0, 3.0]), np.array([2.0, 1.0, -1.0])
    _, saved = module.forward(x, y)
    np.testing.assert_array_equal(module.jvp(np.ones(3), None, saved), [2.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="tangent_y must be None"):
        module.jvp(np.ones(3), np.ones(3), saved)


@pytest.mark.parametrize("op, params, shapes", ELEMENTWISE[:6], ids=[case_id(*c) for c in ELEMENTWISE[:6]])
def test_elementwise_fd_off_ties(op, params, shapes):
    rng = np.random.default_rng(7)
    module = symgrad.load(op, **params)
    _assert_fd(module, [tie_free(rng, s) + 0.3 * i for i, s in enumerate(shapes)], rng)


@pytest.mark.parametrize("op, params, shape", WINDOWED + ADAPTIVE, ids=[case_id(*c) for c in WINDOWED + ADAPTIVE])
@pytest.mark.parametrize("ties", ["first", "split"])
def test_window_fd_off_ties(op, params, shape, ties):
    rng = np.random.default_rng(8)
    module = symgrad.load(op, ties=ties, **params)
    _assert_fd(module, [tie_free(rng, shape)], rng)


def test_none_is_a_zero_tangent():
    module = symgrad.load("maximum", ties="split")
    a, b = np.array([1.0, 2.0, 2.0]), np.array([3.0, 2.0, 1.0])
    _, saved = module.forward(a, b)
    np.testing.assert_array_equal(module.jvp(np.array([1.0, 4.0, 8.0]), None, saved), [0.0, 2.0, 8.0])
    np.testing.assert_array_equal(module.jvp(None, None, saved), np.zeros(3))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_jvp_keeps_the_output_dtype(dtype):
    rng = np.random.default_rng(9)
    for module in (symgrad.load("max_pool2d", kernel_size=2, ties="split"), symgrad.load("amax", dim=1)):
        x = tie_heavy(rng, (2, 4, 6)).astype(dtype)
        out, saved = module.forward(x)
        tangent = module.jvp(np.ones_like(x), saved)
        assert tangent.dtype == dtype and tangent.shape == out.shape


def test_bad_tangents():
    module = symgrad.load("max_pool2d", kernel_size=2)
    x = np.zeros((1, 4, 4))
    _, saved = module.forward(x)
    with pytest.raises(ValueError, match=r"tangent_x must have its input's shape \(1, 4, 4\)"):
        module.jvp(np.zeros((1, 4, 5)), saved)
    with pytest.raises(TypeError, match="tangent_x must be an array of float16, bfloat16, float32 or float64"):
        module.jvp(np.zeros((1, 4, 4), dtype=np.int64), saved)
    with pytest.raises(TypeError, match="saved must be the Saved value"):
        module.jvp(x, (1, 2))


def test_torch_tensors_are_refused_with_a_pointer_to_symgrad_torch():
    torch = pytest.importorskip("torch")
    module = symgrad.load("relu")
    x = torch.ones(3, requires_grad=True)
    for call in (lambda: module.forward(x), lambda: module.backward(x, module.forward(np.ones(3))[1]),
                 lambda: module.jvp(x, module.forward(np.ones(3))[1])):
        with pytest.raises(TypeError, match=r"torch\.Tensor; use symgrad\.torch\.op"):
            call()
    unpool = symgrad.load("max_unpool1d", kernel_size=2)
    with pytest.raises(TypeError, match="indices is a torch.Tensor"):
        unpool.forward(np.ones((1, 2)), torch.zeros(1, 2, dtype=torch.int64))
