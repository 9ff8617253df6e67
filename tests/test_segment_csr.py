"""CSR segments (issue 33): segment_max_csr/segment_min_csr(src, indptr), torch_scatter's
segment_csr form: output j is the extremum of src[indptr[j]:indptr[j + 1]].  Every policy against
the brute-force loop of test_segment (the README's definition), the jax preset against
jax.ops.segment_max bit for bit, the numpy, cpu, torch and jax modules against each other bit for
bit, bad indptr refused, and torch.segment_reduce's backward (PyTorch's own CSR form, not linear
in the gradient) shown beside the torch preset."""

from __future__ import annotations

import re

import numpy as np
import pytest

import symgrad
from test_segment import _brute_scatter, _same_bits, _tie_heavy


def _indptr(rng, rows, segments):
    """Ascending offsets from 0 to rows, with empty segments among them."""
    cuts = np.sort(rng.integers(0, rows + 1, segments - 1))
    return np.concatenate([[0], cuts, [rows]])


def _ids(indptr):
    """The segment of each row, by a loop over the segments."""
    ids = []
    for j in range(len(indptr) - 1):
        ids += [j] * int(indptr[j + 1] - indptr[j])
    return np.array(ids, dtype=np.int64)


@pytest.mark.parametrize("ties", ["first", "last", "split", "all"])
@pytest.mark.parametrize("ext", ["max", "min"])
def test_every_policy_is_the_definition(ties, ext):
    """Rows segmented by indptr; an empty segment is the identity (-inf for max) and sends no
    gradient."""
    rng = np.random.default_rng(7)
    mod = symgrad.load(f"segment_{ext}_csr", ties=ties)
    fill = -np.inf if ext == "max" else np.inf
    for _ in range(10):
        src = _tie_heavy(rng, (9, 2), np.float64)
        indptr = _indptr(rng, 9, 5)
        g = rng.choice([1.0, -3.0, 0.5], (5, 2))
        y, saved = mod.forward(src, indptr)
        (grad, none), ids = mod.backward(g, saved), _ids(indptr)
        assert none is None
        for c in range(2):
            want, _, gs = _brute_scatter(np.full(5, fill), ids, src[:, c], ties, ext, False, g[:, c])
            np.testing.assert_array_equal(y[:, c], want)
            np.testing.assert_array_equal(grad[:, c], gs)


@pytest.mark.parametrize("dtype", [pytest.param(np.float32, marks=pytest.mark.slow), np.float64])
def test_jax_preset_is_segment_max_bit_for_bit(dtype):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(8)
    mod = symgrad.load("segment_max_csr", convention="jax")
    for _ in range(10):
        src = _tie_heavy(rng, (10, 3), dtype)
        indptr = _indptr(rng, 10, 4)
        g = np.array(rng.choice([1.0, -3.0, 0.0, 7.0], (4, 3)), dtype=dtype)
        ids = jax.numpy.asarray(_ids(indptr))
        f = lambda x: jax.ops.segment_max(x, ids, num_segments=4)  # noqa: E731
        want, vjp = jax.vjp(f, jax.numpy.asarray(src))
        y, saved = mod.forward(src, indptr)
        _same_bits(y, np.asarray(want))
        _same_bits(mod.backward(g, saved)[0], np.asarray(vjp(jax.numpy.asarray(g))[0]))


CASES = [("segment_max_csr", {"ties": "split"})] + [  # the others under -m slow
    pytest.param(*case, marks=pytest.mark.slow) for case in (
        ("segment_max_csr", {"ties": "first"}), ("segment_min_csr", {"ties": "last"}),
        ("segment_min_csr", {"convention": "torch"}), ("segment_max_csr", {"convention": "jax"}))]


def _numpy_results(mod, src, indptr, g, t):
    y, saved = mod.forward(src, indptr)
    return y, mod.backward(g, saved)[0], mod.jvp(t, None, saved)


@pytest.mark.parametrize("op, policy", CASES)
def test_cpu_torch_jax_modules_are_the_numpy_module(op, policy):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(9)
    src, indptr = _tie_heavy(rng, (11, 3), np.float32), _indptr(rng, 11, 5)
    g, t = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(11, 3)).astype(np.float32)
    want = _numpy_results(symgrad.load(op, **policy), src, indptr, g, t)
    got = {"cpu": _numpy_results(symgrad.load(op, backend="cpu", **policy), src, indptr, g, t)}
    mod = symgrad.load(op, backend="torch", **policy)
    y, saved = mod.forward(torch.tensor(src), torch.tensor(indptr))
    got["torch"] = (y, mod.backward(torch.tensor(g), saved)[0], mod.jvp(torch.tensor(t), None, saved))
    mod, jit = symgrad.load(op, backend="jax", **policy), pytest.importorskip("jax").jit  # (eager: slow)
    y, saved = jit(mod.forward)(jnp.asarray(src), jnp.asarray(indptr))
    got["jax"] = (y, jit(mod.backward)(jnp.asarray(g), saved)[0],
                  jit(lambda tangent, s: mod.jvp(tangent, None, s))(jnp.asarray(t), saved))
    for backend, results in got.items():
        for name, a, b in zip(("forward", "backward", "jvp"), results, want):
            a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
            _same_bits(a, b)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_bad_indptr_is_refused_in_one_line(backend):
    torch = pytest.importorskip("torch")
    mod = symgrad.load("segment_max_csr", backend=backend, ties="first")
    arr = (lambda a: torch.tensor(a)) if backend == "torch" else np.asarray  # noqa: E731
    src = arr(np.zeros((4, 2)))
    for indptr, what in (([0, 3, 2, 4], "ascend"), ([1, 4], "ascend from 0"), ([0, 3], "src.shape[0] = 4"),
                         ([[0, 4]], "1-d indptr")):
        with pytest.raises(ValueError, match=re.escape(what)) as err:
            mod.forward(src, arr(np.array(indptr)))
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="integers"):
        mod.forward(src, arr(np.array([0.0, 4.0])))


def test_torch_segment_reduce_backward_is_not_linear_and_the_torch_preset_is():
    """PyTorch's own CSR form, torch.segment_reduce(src, 'max', offsets=indptr), divides a tie's
    gradient by the count only where the gradient is positive (conventions: segment_max_csr's
    torch preset); the preset splits every gradient: g / 3 to each of three tied maxima."""
    torch = pytest.importorskip("torch")
    mod = symgrad.load("segment_max_csr", convention="torch")
    src, indptr = np.array([5.0, 5.0, 5.0, 1.0]), np.array([0, 4])
    y, saved = mod.forward(src, indptr)
    for g in (3.0, -3.0):
        x = torch.tensor(src, requires_grad=True)
        torch.segment_reduce(x, "max", offsets=torch.tensor(indptr)).backward(torch.tensor([g]))
        np.testing.assert_array_equal(mod.backward(np.array([g]), saved)[0], [g / 3] * 3 + [0.0])
        assert x.grad.tolist() == ([1.0] * 3 if g > 0 else [-3.0] * 3) + [0.0]
