"""The torch backend's pooling and maxout modules compiled by Inductor (torch.compile(fullgraph=True)):
their gather-form backward, each window element's gradient put in place by reshapes and pads that
Inductor fuses into one pass, equals the NumPy backend's module bit for bit (signs of zero, NaN and
infinities, ties), as the eager module does (test_torch_backend).  Oracle: the NumPy module."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import symgrad  # noqa: E402
from test_torch_backend import DTYPES, _same, _tensor, _window_arrays  # noqa: E402

# overlapping windows with padding (the sums), non-overlapping (grad_output written: -0 stays -0),
# dilation and ceil_mode, 3-d, and maxout's integer element index
CASES = [
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "split"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "first"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 2, "convention": "torch"}, (2, 3, 6, 8)),
    ("max_pool2d", {"kernel_size": 2, "convention": "jax"}, (2, 3, 6, 8)),
    ("max_pool2d", {"kernel_size": 2, "ties": "split"}, (2, 3, 7, 5)),  # tiles, a row and a column in none
    ("max_pool1d", {"kernel_size": 4, "stride": 1, "padding": 2, "dilation": 2, "ceil_mode": True,
                    "ties": "all"}, (2, 2, 11)),
    ("max_pool3d", {"kernel_size": 2, "stride": 1, "padding": 1, "ties": "last", "nan": "last_nan"}, (1, 2, 3, 4, 3)),
    ("maxout", {"pieces": 2, "convention": "torch"}, (3, 6, 5)),
    # the whole plane one window under the jax preset: the fold's value from one pass of row reductions
    ("adaptive_max_pool2d", {"output_size": 1, "convention": "jax"}, (2, 3, 4, 6)),
]


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="inductor")


@pytest.mark.slow  # Inductor compiles 14 graphs: about a minute on the loaded 2-core machine
@pytest.mark.parametrize("name,kw,shape", CASES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CASES)])
def test_compiled_window_module_equals_numpy_module(name, kw, shape):
    np_mod, th_mod = symgrad.load(name, **kw), symgrad.load(name, backend="torch", **kw)
    a, rng = _window_arrays(shape, DTYPES["float32"][1], 0)
    y_np, s_np = np_mod.forward(a)
    g = rng.standard_normal(y_np.shape)
    g.ravel()[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]
    g = g.astype(a.dtype)
    with np.errstate(invalid="ignore"):
        want = np_mod.backward(g, s_np)[0]

    t = rng.standard_normal(shape).astype(a.dtype)
    t.ravel()[:3] = [-0.0, np.inf, np.nan]
    with np.errstate(invalid="ignore"):
        want_jvp = np_mod.jvp(t, s_np)

    def step(x, grad, tangent):
        y, saved = th_mod.forward(x)
        return y, th_mod.backward(grad, saved)[0], th_mod.jvp(tangent, saved)
    y, got, got_jvp = _compiled(step)(*(_tensor(v, "float32") for v in (a, g, t)))
    _same(y, y_np, f"{name} {kw} compiled forward")
    _same(got, want, f"{name} {kw} compiled backward")
    _same(got_jvp, want_jvp, f"{name} {kw} compiled jvp")


# adaptive windows: each output's window a block of the input (one holding window per element), so
# an element that is no window's winner (or whose weight is -0) gets +0.0 + -0.0 = +0.0 from the
# NumPy module; a start of zeros that Inductor folds away (zeros + w is w) would leave -0.0
ADAPTIVE_CASES = [
    ("adaptive_max_pool2d", {"output_size": (2, 3), "ties": "first"}, (2, 3, 4, 6)),
    ("adaptive_max_pool2d", {"output_size": (2, 3), "ties": "split"}, (2, 3, 4, 6)),
    # output size 1: the whole plane one window (_adaptive_whole)
    ("adaptive_max_pool2d", {"output_size": 1, "ties": "first"}, (2, 3, 4, 6)),
    ("adaptive_max_pool2d", {"output_size": 1, "ties": "split"}, (2, 3, 4, 6)),
]


@pytest.mark.slow  # Inductor compiles 2 graphs of 24 window elements each
@pytest.mark.parametrize("name,kw,shape", ADAPTIVE_CASES, ids=[f"{kw['output_size']}-{kw['ties']}" for _, kw, _ in ADAPTIVE_CASES])
def test_compiled_adaptive_module_starts_from_plus_zero(name, kw, shape):
    np_mod, th_mod = symgrad.load(name, **kw), symgrad.load(name, backend="torch", **kw)
    a, rng = _window_arrays(shape, np.float32, 0)
    y_np, s_np = np_mod.forward(a)
    g = np.where(rng.random(y_np.shape) < 0.5, -0.0, -rng.random(y_np.shape)).astype(np.float32)
    t = np.where(rng.random(shape) < 0.5, -0.0, rng.standard_normal(shape)).astype(np.float32)
    want, want_jvp = np_mod.backward(g, s_np)[0], np_mod.jvp(t, s_np)
    assert (np.signbit(want) & (want == 0)).sum() < (want == 0).sum()  # +0.0 entries that a fold would flip

    def step(x, grad, tangent):
        y, saved = th_mod.forward(x)
        return y, th_mod.backward(grad, saved)[0], th_mod.jvp(tangent, saved)
    y, got, got_jvp = _compiled(step)(*(torch.from_numpy(v) for v in (a, g, t)))
    _same(y, y_np, f"{name} {kw} compiled forward")
    _same(got, want, f"{name} {kw} compiled backward")
    _same(got_jvp, want_jvp, f"{name} {kw} compiled jvp")
