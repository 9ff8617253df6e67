"""cummax / cummin at the edges (issue 29, loose end 2): rows of length zero, and gradients
whose sums meet inf - inf.  The NumPy module's first/last backward raised on a zero-length ranked
dim (a reshape to (-1, 0)) and warned on inf - inf; here it is checked against a brute-force loop
written from the README's definition (output i the extremum of x[0..i], the lower index winning
a tie under first, the higher under last, NaN above every number; its winner gathers the
gradients of the outputs it holds, added from +0 in output order), and every backend (cpu, torch,
jax) against it on the same inputs, bit for bit, under every policy and preset.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import symgrad
from conftest import same_values

INF = np.inf
X = np.array([[INF, INF, 1.0, INF, -INF], [-INF, -INF, np.nan, -INF, np.nan], [2.0, -INF, 2.0, INF, 3.0]],
             dtype=np.float32)
G = np.array([[INF, -INF, 1.0, INF, -INF], [1.0, INF, -INF, 2.0, -INF], [-INF, INF, INF, -INF, 0.5]],
             dtype=np.float32)
# (shape, dim): a zero-length ranked dim (last or not), and zero rows of a non-empty dim
EMPTY = [((3, 0), 1), ((0, 3), 0), ((2, 0, 3), 1), ((0, 3), 1)]
SETTINGS = [{"ties": "first"}, {"ties": "last"}, {"ties": "split"}, {"convention": "torch"}, {"convention": "jax"}]


def _brute(name: str, ties: str, x: np.ndarray, g: np.ndarray):
    """(values, indices, grad) of each row of x (ranked along the last dim), by the definition."""
    values, indices, grad = np.empty_like(x), np.empty(x.shape, np.int64), np.zeros_like(x)
    for r in np.ndindex(*x.shape[:-1]):
        row = x[r]
        for i in range(row.shape[0]):
            best = 0
            for j in range(1, i + 1):
                a, b = row[j], row[best]
                if np.isnan(a) or np.isnan(b):
                    wins = np.isnan(a) and (not np.isnan(b) or ties == "last")
                elif a == b:
                    wins = ties == "last"
                else:
                    wins = a > b if name == "cummax" else a < b
                best = j if wins else best
            values[r][i], indices[r][i] = row[best], best
            with np.errstate(invalid="ignore"):
                grad[r][best] = grad[r][best] + g[r][i]
    return values, indices, grad


def _numpy_results(module, x, g):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning (inf - inf is NaN, silently)
        (values, indices), saved = module.forward(x)
        return values, indices, module.backward(g, saved)[0], module.jvp(g, saved)


@pytest.mark.parametrize("name,ties", [("cummax", "first"), ("cummin", "last"),
                                       pytest.param("cummax", "last", marks=pytest.mark.slow),
                                       pytest.param("cummin", "first", marks=pytest.mark.slow)])
def test_first_last_against_brute_force(name, ties):
    module = symgrad.load(name, ties=ties, dim=-1)
    values, indices, grad, jvp = _numpy_results(module, X, G)
    want_values, want_indices, want_grad = _brute(name, ties, X, G)
    assert same_values(values, want_values) and np.array_equal(indices, want_indices)
    assert same_values(grad, want_grad)
    assert same_values(jvp, np.take_along_axis(G, want_indices, axis=-1))
    for shape, dim in EMPTY:
        module = symgrad.load(name, ties=ties, dim=dim)
        x = np.zeros(shape, np.float32)
        values, indices, grad, jvp = _numpy_results(module, x, x)
        assert values.shape == indices.shape == grad.shape == jvp.shape == shape
        assert indices.dtype == np.int64 and grad.dtype == np.float32


def _cases():
    """Every (backend, op, settings, shape, dim); the default run: the torch backend's cummax
    under first on the inf - inf rows and the empty shapes along the last dim; -m slow the rest
    (each cpu module compiles its library, each JAX shape compiles: seconds)."""
    out = []
    for backend in ("cpu", "torch", "jax"):
        for name in ("cummax", "cummin"):
            for settings in SETTINGS:
                for shape, dim in [(X.shape, -1)] + EMPTY:
                    default = (backend, name, settings.get("ties")) == ("torch", "cummax", "first") and dim != 0
                    out.append(pytest.param(backend, name, settings, shape, dim, marks=() if default else pytest.mark.slow,
                                            id=f"{backend}-{name}-{'-'.join(map(str, settings.values()))}-{shape}-{dim}"))
    return out


def _torch_results(module, x, g):
    torch = pytest.importorskip("torch")
    (values, indices), saved = module.forward(torch.from_numpy(x))
    grad = module.backward(torch.from_numpy(g), saved)[0]
    return values.numpy(), indices.numpy(), grad.numpy(), module.jvp(torch.from_numpy(g), saved).numpy()


def _jax_results(module, x, g):
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):  # (int64 indices; split's tie blocks are summed in float64)
        (values, indices), saved = module.forward(jax.numpy.asarray(x))
        grad = module.backward(jax.numpy.asarray(g), saved)[0]
        return tuple(np.asarray(a) for a in (values, indices, grad, module.jvp(jax.numpy.asarray(g), saved)))


RUNNERS = {"cpu": _numpy_results, "torch": _torch_results, "jax": _jax_results}


@pytest.mark.parametrize("backend,name,settings,shape,dim", _cases())
def test_every_backend_agrees_with_the_numpy_module(backend, name, settings, shape, dim):
    x = X if shape == X.shape else np.zeros(shape, np.float32)
    g = G if shape == X.shape else x
    want = _numpy_results(symgrad.load(name, **settings, dim=dim), x, g)
    got = RUNNERS[backend](symgrad.load(name, backend=backend, **settings, dim=dim), x, g)
    for a, b, what in zip(got, want, ("values", "indices", "grad", "jvp")):
        assert a.shape == b.shape, what
        assert same_values(a, b) if what != "indices" else np.array_equal(a, b), what
