"""Order statistics (issue 29, item 3) in the framework backends: the torch and jax backends'
modules of sort, topk, cummax, cummin, kthvalue, median and nanmedian against the NumPy
backend's module (itself checked against a brute-force W and the frameworks in test_order.py and
test_median.py), bit for bit on the CPU: forward values and indices, backward and jvp, every
policy, NaN rule and preset, float16/32/64 and bfloat16, signs of zero included, on tie-heavy
inputs with NaN, +-inf and +-0.  The JAX modules run under jax.jit (each new shape and dtype
compiles, a few seconds on a loaded 2-core machine): the default run holds a few representative
variants (rank, prefix and one-rank bodies; one winner, tie blocks, JAX's tree, the midpoint) on
few shapes and dtypes; -m slow every variant (the JAX ones on fewer shapes).
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from conftest import same_values

ml_dtypes = pytest.importorskip("ml_dtypes")

POOL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan, 0.5])
GRADS = np.array([1.0, -2.0, 0.5, 3.0, -0.25, -0.0, 1 / 3])
TANGENTS = np.array([1.0, -2.0, 0.5, 4.0, -0.0, 0.1])
DTYPES = (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)
# (op, params): each layout (dim last or not, keepdim, every element one row)
CASES = [("sort", {}), ("sort", {"descending": True, "dim": 0}), ("topk", {"k": 3}),
         ("topk", {"k": 2, "largest": False, "dim": 0}), ("cummax", {"dim": 1}), ("cummin", {"dim": 0}),
         ("kthvalue", {"k": 2, "dim": 1}), ("median", {"dim": 1}), ("median", {}),
         ("median", {"dim": 0, "keepdim": True}), ("nanmedian", {"dim": 1}), ("nanmedian", {})]
NANS = {"sort": ["largest"], "topk": ["largest"], "cummax": ["dominate", "zero"], "cummin": ["dominate", "zero"],
        "kthvalue": ["largest"], "median": ["dominate", "propagate"], "nanmedian": ["omit", "omit_zero"]}
# shapes: ties in short rows, rows past NumPy's pairwise-sum block (128), rows of one, 0-d
SHAPES = ((3, 7), (4, 5), (2, 150), (5, 1), (1, 9), ())


def _settings():
    """Every (op, params, settings) that loads: each policy under each NaN rule, and the presets."""
    out = []
    for name, params in CASES:
        out += [(name, params, {"convention": c}) for c in ("torch", "jax")]
        out += [(name, params, {"ties": t, "nan": n}) for t in ("first", "last", "split", "all")
                for n in NANS[name] if not (n == "zero" and t in ("first", "last"))]
    return out


def _id(case) -> str:
    name, params, settings = case
    return "-".join([name] + [f"{k}={v}" for k, v in {**params, **settings}.items()])


# one variant of each body and partial: rank first/last and blocks (written, added, negated
# gradients), prefix one winner, blocks (NaN rule 'zero') and JAX's tree, one rank single, pair
# and blocks (NaN sends nothing), every element one row
REPRESENTATIVE = {"topk-k=2-largest=False-dim=0-convention=jax", "topk-k=3-ties=split-nan=largest",
                  "cummin-dim=0-convention=torch", "cummax-dim=1-ties=all-nan=zero", "cummax-dim=1-convention=jax",
                  "median-dim=1-convention=jax", "nanmedian-dim=1-ties=split-nan=omit_zero"}
JAX_REPRESENTATIVE = {"median-dim=1-ties=all-nan=propagate"}


def _variants(representative):
    return [pytest.param(*c, id=_id(c), marks=() if _id(c) in representative else pytest.mark.slow)
            for c in _settings()]


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _compare(module, framework, to_framework, to_numpy, shapes, dtypes, seed=0, run=lambda f: f):
    """Forward (values, indices), backward and jvp of the framework module against the NumPy
    module on tie-heavy inputs; the list of what differs."""
    rng = np.random.default_rng(seed)
    bad = []
    for dtype in dtypes:
        for shape in shapes:
            x = rng.choice(POOL, size=shape).astype(dtype)
            try:
                out, saved = module.forward(x)
            except ValueError as exc:  # k past a row's length, an empty row: the same one-line error
                with pytest.raises(ValueError) as info:
                    framework.forward(to_framework(x))
                assert str(info.value) == str(exc)
                continue
            f_out, f_saved = run(framework.forward)(to_framework(x))
            g = rng.choice(GRADS, size=_outputs(out)[0].shape).astype(dtype)
            t = rng.choice(TANGENTS, size=x.shape).astype(dtype)
            pairs = [(f"output {k}", a, b) for k, (a, b) in enumerate(zip(_outputs(out), _outputs(f_out)))]
            pairs += [("backward", module.backward(g, saved)[0], run(framework.backward)(to_framework(g), f_saved)[0]),
                      ("jvp", module.jvp(t, saved), run(framework.jvp)(to_framework(t), f_saved))]
            for what, want, got in pairs:
                got = to_numpy(got)
                if not same_values(got, want):
                    bad.append(f"{np.dtype(dtype).name} {shape} {what}: got {got.tolist()}, want {want.tolist()}")
    return bad


# ----------------------------------------------------------------------------- torch backend

def _torch():
    return pytest.importorskip("torch")


def _to_torch(a):
    torch = _torch()
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def _from_torch(t):
    torch = _torch()
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


@pytest.mark.parametrize("name,params,settings", _variants(REPRESENTATIVE))
def test_torch_backend_module_equals_the_numpy_module(name, params, settings):
    module = symgrad.load(name, **settings, **params)
    framework = symgrad.load(name, backend="torch", **settings, **params)
    assert _compare(module, framework, _to_torch, _from_torch, SHAPES, DTYPES) == []


# ----------------------------------------------------------------------------- jax backend

def _jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)  # float64 inputs, int64 indices, the tie blocks' sums
    return jax


def _to_jax(a):
    return _jax().numpy.asarray(a)


def _from_jax(a):
    return np.asarray(a)


@pytest.mark.parametrize("name,params,settings", _variants(JAX_REPRESENTATIVE))
def test_jax_backend_module_equals_the_numpy_module(name, params, settings, request):
    """Under jax.jit: float32 on a (3, 7) input in the default run; -m slow every dtype on short
    rows, rows of 150 and 0-d."""
    jax = _jax()
    module = symgrad.load(name, **settings, **params)
    framework = symgrad.load(name, backend="jax", **settings, **params)
    slow = request.node.get_closest_marker("slow") is not None
    shapes, dtypes = ((3, 7), (2, 150), ()) if slow else ((3, 7),), DTYPES if slow else (np.float32,)
    assert _compare(module, framework, _to_jax, _from_jax, shapes, dtypes, run=jax.jit) == []
