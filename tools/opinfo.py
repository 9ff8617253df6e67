"""Fidelity against PyTorch 2.13's own OpInfo samples (and JAX where a JAX function corresponds).

    python tools/opinfo.py --quick                # a few samples per op and dtype (a few minutes)
    python tools/opinfo.py --only relu max_pool2d --backends numpy
    python tools/opinfo.py --frameworks torch --limit 200

Not a test: it prints one table and asserts nothing (tests/test_opinfo_tool.py runs it on a tiny
subset).  Needs torch (the CPU build), expecttest (PyTorch's testing package imports it), ml_dtypes
(bfloat16), jax for the JAX rows and a C compiler for the cpu backend.

For every op symgrad has a preset for, the samples of PyTorch's OpInfo entry
(torch.testing._internal.common_methods_invocations.op_db, sample_inputs on the CPU in float64,
float32, float16 and bfloat16) are run through symgrad.load(op, backend=..., convention=...) and
through the framework, in three variants of each sample's floating inputs:

* plain: the sample as OpInfo makes it;
* ties: its values rounded to a few levels (round(x / 4): -2..2 for OpInfo's [-9, 9]), so windows,
  rows and pairs tie;
* special: the ties variant with about 40% of the elements replaced by NaN, +-inf, +0 and -0.

Forward (the output) and backward (each differentiable input's gradient for a grad_output drawn
from a normal distribution) are compared bit for bit (signs of zero and NaN bits included).  A
sample differs when the output or any gradient differs, or symgrad raises where the framework
computes.  Of the differing samples the table counts those that involve NaN (a NaN in an input,
output or gradient on either side), those that are a documented framework self-contradiction,
decided per sample: for PyTorch's elementwise ops (README, Framework conventions: PyTorch's SIMD
lanes) symgrad equals PyTorch run on each element alone (one-element tensors, its scalar path)
while the whole tensor gives another result for the same values; for JAX's binary ops with a
broadcast input (docs/conventions.md, broadcast_sum "jax": XLA's order depends on the shape)
symgrad equals JAX's reduce_sum of the same per-element gradients, each output's terms alone as
one row, while the broadcast's reduce gives another; and those of an exception docs/guarantees.md
or docs/backends.md states (documented(): logsumexp's float32/float64 exp and log).  The
fidelity target (issue 28) is 100% of the samples that involve no NaN, outside those.  The cpu
backend's documented refusal of bfloat16 where a preset adds in bfloat16 is counted apart.

The cpu backend compiles a library per op configuration (seconds each), so it runs on the first
--cpu-configs configurations of each op only; samples are spread over an entry's list (every k-th,
at most --limit per op and dtype).  Settings PyTorch refuses are left out; symgrad refusing what
PyTorch computes is counted as differing ('errors').
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DTYPES = ("float64", "float32", "float16", "bfloat16")
VARIANTS = ("plain", "ties", "special")
SPECIALS = (np.nan, np.inf, -np.inf, 0.0, -0.0)


def _imports():
    global torch, F, symgrad, BF16
    try:
        import torch
        import torch.nn.functional as F
        from torch.testing._internal import common_methods_invocations  # noqa: F401
    except ImportError as e:
        sys.exit(f"tools/opinfo.py needs PyTorch's testing package ({e}): "
                 'pip install ".[torch]" expecttest')
    import ml_dtypes
    import symgrad
    BF16 = np.dtype(ml_dtypes.bfloat16)


# ------------------------------------------------------------------ conversions and comparison

def to_numpy(t) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(BF16).copy()
    return t.contiguous().numpy().copy()


def to_torch(a: np.ndarray):
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, order="C", copy=True))


def _bits(a) -> np.ndarray:
    a = np.array(a, order="C", copy=True)
    return a.reshape(-1).view(np.uint8) if a.dtype.kind in "fV" or a.dtype == BF16 else a


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(_bits(a), _bits(b))


def _floating(a) -> bool:
    a = np.asarray(a)
    return a.dtype.kind == "f" or a.dtype == BF16


# ------------------------------------------------------------------ OpInfo samples -> cases

class Case:
    """One call: symgrad's op and parameters, the inputs (NumPy), which of them are
    differentiable, and the framework's function of the inputs (torch tensors or jax arrays)."""

    def __init__(self, op, params, inputs, wrt, torch_fn, jax_fn=None, elementwise=False):
        self.op, self.params, self.inputs, self.wrt = op, params, inputs, wrt
        self.torch_fn, self.jax_fn, self.elementwise = torch_fn, jax_fn, elementwise

    def key(self):
        return (self.op, tuple(sorted((k, repr(v)) for k, v in self.params.items())))


def _jnp():
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    return jax, jnp


def _unary(op, torch_of, jax_of=None, **fixed):
    """relu-like ops: the sample's kwargs are the op's parameters (renamed by fixed)."""
    def make(s):
        params = {k: v for k, v in s.kwargs.items() if k not in ("inplace", "training")}
        if s.args:
            return "positional parameters"
        if s.kwargs.get("training"):
            params.pop("training", None)
        params.update(fixed)
        x = to_numpy(s.input)
        return Case(op, params, [x], [0], lambda t: torch_of(t, **params),
                    jax_of and (lambda v: jax_of(v, **params)), elementwise=True)
    return make


def _binary(op, torch_of, jax_name):
    def make(s):
        other = s.args[0]
        if not isinstance(other, torch.Tensor):
            return "a number operand"
        x, y = to_numpy(s.input), to_numpy(other)
        return Case(op, {}, [x, y], [0, 1], torch_of,
                    lambda a, b: getattr(_jnp()[1], jax_name)(a, b), elementwise=True)
    return make


def _dims(dim):
    return None if dim is None or dim == () else dim


def _reduction(op, torch_name, jax_name):
    def make(s):
        args = list(s.args)
        dim = s.kwargs.get("dim", args[0] if args else None)
        keepdim = s.kwargs.get("keepdim", args[1] if len(args) > 1 else False)
        x = to_numpy(s.input)
        params = {} if op in ("max", "min") else {"dim": _dims(dim), "keepdim": bool(keepdim)}
        if op == "logsumexp" and params["dim"] is None:
            return "no dim"
        params = {k: v for k, v in params.items() if v is not None}
        if op in ("max", "min"):
            torch_fn = getattr(torch, torch_name)
        else:
            torch_fn = lambda t: getattr(torch, torch_name)(t, dim if dim is not None else (), keepdim)  # noqa: E731

        def jax_fn(v):
            jax, jnp = _jnp()
            axis = params.get("dim")
            axis = tuple(axis) if isinstance(axis, (tuple, list)) else axis
            if op == "logsumexp":
                return jax.nn.logsumexp(v, axis=axis, keepdims=params["keepdim"])
            return getattr(jnp, jax_name)(v, axis=axis, keepdims=params.get("keepdim", False))
        return Case(op, params, [x], [0], torch_fn, jax_fn)
    return make


def _pool(d):
    def make(s):
        kw = dict(s.kwargs)
        kw["return_indices"] = False
        x = to_numpy(s.input)
        params = {k: v for k, v in kw.items() if k != "return_indices" and v is not None}
        fn = getattr(F, f"max_pool{d}d")
        return Case(f"max_pool{d}d", params, [x], [0], lambda t: fn(t, **kw), _jax_pool(params, x, d))
    return make


def _tuple(v, d):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * d


def _jax_pool(params, x, d):
    """lax.reduce_window(max) with -inf padding, ceil_mode by right padding (PyTorch's windows);
    None where JAX has no such function (dilation: JAX has no VJP for it)."""
    k = _tuple(params["kernel_size"], d)
    st = _tuple(params.get("stride") or k, d)
    p = _tuple(params.get("padding", 0), d)
    if any(v != 1 for v in _tuple(params.get("dilation", 1), d)):
        return None
    spatial = x.shape[-d:]
    outs = []
    for L, kk, ss, pp in zip(spatial, k, st, p):
        n = L + 2 * pp - kk
        o = (-(-n // ss) if params.get("ceil_mode") else n // ss) + 1
        if params.get("ceil_mode") and (o - 1) * ss >= L + pp:
            o -= 1
        outs.append(o)
    lead = x.ndim - d
    pads = [(0, 0)] * lead + [(pp, max(0, (o - 1) * ss + kk - L - pp)) for L, kk, ss, pp, o in
                              zip(spatial, k, st, p, outs)]
    crop = (Ellipsis,) + tuple(slice(0, o) for o in outs)

    def fn(v):
        jax, jnp = _jnp()
        return jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, (1,) * lead + k, (1,) * lead + st, pads)[crop]
    return fn


def _adaptive(d):
    def make(s):
        size, x = s.args[0], to_numpy(s.input)
        size = _tuple(size, d)
        size = tuple(x.shape[-d + i] if v is None else v for i, v in enumerate(size))
        fn = getattr(F, f"adaptive_max_pool{d}d")
        return Case(f"adaptive_max_pool{d}d", {"output_size": size}, [x], [0], lambda t: fn(t, size))
    return make


def _fractional(d):
    def make(s):
        x = to_numpy(s.input)
        if x.ndim != d + 2:
            return "unbatched input"
        kw = {k: v for k, v in s.kwargs.items() if k != "return_indices"}
        k = s.args[0]
        rng = np.random.default_rng(x.size)
        u = (0.99 * rng.random(x.shape[:2] + (d,))).astype(x.dtype)
        params = {"kernel_size": k, **{a: (tuple(v) if isinstance(v, (list, tuple)) else v) for a, v in kw.items()}}
        fn = getattr(F, f"fractional_max_pool{d}d")
        return Case(f"fractional_max_pool{d}d", params, [x, u], [0],
                    lambda t, r: fn(t, k, _random_samples=r, **kw))
    return make


def _unpool(d):
    def make(s):
        x, idx = to_numpy(s.input), to_numpy(s.args[0])
        kw = dict(s.kwargs)
        out = kw.get("output_size")
        params = {k: v for k, v in kw.items() if v is not None and k != "output_size"}
        if out is not None:
            params["output_size"] = tuple(out)[-d:]
        fn = getattr(F, f"max_unpool{d}d")
        return Case(f"max_unpool{d}d", params, [x, idx], [0], lambda t, i: fn(t, i, **kw),
                    _jax_unpool(idx, x, d, params, fn, kw))
    return make


def _jax_unpool(idx, x, d, params, fn, kw):
    """zeros.at[indices].set(input) per plane, as one writes max_unpool in JAX (the jax preset)."""
    out = tuple(fn(torch.zeros(x.shape, dtype=torch.float64), torch.from_numpy(idx), **kw).shape)
    lead = x.ndim - d
    planes = int(np.prod(out[:lead]))
    size = int(np.prod(out[lead:]))

    def unpool(a):
        _, jnp = _jnp()
        rows = jnp.arange(planes)[:, None]
        ids = jnp.asarray(idx.reshape(planes, -1))
        return jnp.zeros((planes, size), a.dtype).at[rows, ids].set(a.reshape(planes, -1)).reshape(out)
    return unpool


def _jax_act(name):
    def fn(v, **params):
        jax, jnp = _jnp()
        if name == "hardtanh":  # jax.nn.hard_tanh's where form, at the sample's bounds
            lo, hi = params.get("min_val", -1.0), params.get("max_val", 1.0)
            return jnp.where(v > hi, hi, jnp.where(v < lo, lo, v)).astype(v.dtype)
        if name == "leaky_relu":
            return jax.nn.leaky_relu(v, params.get("negative_slope", 0.01))
        return getattr(jax.nn, name)(v) if name != "abs" else jnp.abs(v)
    return fn


def _rrelu(t, lower=1 / 8, upper=1 / 3, **_):
    return F.rrelu(t, lower, upper, training=False)


# OpInfo entry -> a function of one SampleInput: a Case, or a string saying why it is left out
def ADAPTERS():
    return {
        "nn.functional.relu": _unary("relu", lambda t: F.relu(t), _jax_act("relu")),
        "nn.functional.relu6": _unary("relu6", lambda t: F.relu6(t), _jax_act("relu6")),
        "nn.functional.hardtanh": _unary("hardtanh", lambda t, **p: F.hardtanh(t, **p), _jax_act("hardtanh")),
        "nn.functional.leaky_relu": _unary("leaky_relu", lambda t, **p: F.leaky_relu(t, **p),
                                           _jax_act("leaky_relu")),
        "nn.functional.softshrink": _unary("softshrink", lambda t, **p: F.softshrink(t, **p)),
        "nn.functional.hardshrink": _unary("hardshrink", lambda t, **p: F.hardshrink(t, **p)),
        "nn.functional.rrelu": _unary("rrelu", _rrelu),
        "abs": _unary("abs", lambda t: torch.abs(t), _jax_act("abs")),
        "maximum": _binary("maximum", torch.maximum, "maximum"),
        "minimum": _binary("minimum", torch.minimum, "minimum"),
        "max.binary": _binary("maximum", torch.max, "maximum"),
        "min.binary": _binary("minimum", torch.min, "minimum"),
        "fmax": _binary("fmax", torch.fmax, "fmax"),
        "fmin": _binary("fmin", torch.fmin, "fmin"),
        "amax": _reduction("amax", "amax", "max"),
        "amin": _reduction("amin", "amin", "min"),
        "max.reduction_no_dim": _reduction("max", "max", "max"),
        "min.reduction_no_dim": _reduction("min", "min", "min"),
        "logsumexp": _reduction("logsumexp", "logsumexp", None),
        **{f"nn.functional.max_pool{d}d": _pool(d) for d in (1, 2, 3)},
        **{f"nn.functional.adaptive_max_pool{d}d": _adaptive(d) for d in (1, 2, 3)},
        **{f"nn.functional.fractional_max_pool{d}d": _fractional(d) for d in (2, 3)},
        **{f"nn.functional.max_unpool{d}d": _unpool(d) for d in (1, 2, 3)},
    }


# ------------------------------------------------------------------ variants

def variant(case: Case, name: str, rng) -> Case:
    if name == "plain":
        return case
    inputs = list(case.inputs)
    for i in case.wrt:
        a = inputs[i]
        v = np.round(a.astype(np.float64) / 4)
        if name == "special" and v.size:
            hit = rng.random(v.shape) < 0.4
            v = np.where(hit, rng.choice(np.array(SPECIALS), v.shape), v)
        inputs[i] = v.astype(a.dtype)
    return Case(case.op, case.params, inputs, case.wrt, case.torch_fn, case.jax_fn, case.elementwise)


# ------------------------------------------------------------------ the frameworks' results

def torch_run(case: Case, g, inputs=None):
    ts = [to_torch(a) for a in (inputs or case.inputs)]
    for i in case.wrt:
        ts[i].requires_grad_(True)
    out = case.torch_fn(*ts)
    if isinstance(out, tuple):
        out = out[0]
    grads = [None] * len(case.wrt)
    if out.requires_grad and out.numel():
        grads = torch.autograd.grad(out, [ts[i] for i in case.wrt], to_torch(g), allow_unused=True)
        grads = [torch.zeros_like(ts[i]) if gr is None else gr for i, gr in zip(case.wrt, grads)]
    return to_numpy(out), [None if gr is None else to_numpy(gr) for gr in grads]


def jax_run(case: Case, g):
    jax, jnp = _jnp()
    xs = [jnp.asarray(a) for a in case.inputs]

    def f(*w):
        full = list(xs)
        for i, v in zip(case.wrt, w):
            full[i] = v
        return case.jax_fn(*full)
    plain = np.asarray(f(*[xs[i] for i in case.wrt]))  # the function as called (not jax.vjp's primal)
    _, vjp = jax.vjp(f, *[xs[i] for i in case.wrt])
    return plain, [np.asarray(v) for v in vjp(jnp.asarray(g))]


_MODULES: dict = {}


def symgrad_run(case: Case, g, backend: str, convention: str):
    key = (case.key(), backend, convention)
    if key not in _MODULES:
        _MODULES[key] = symgrad.load(case.op, backend=backend, convention=convention, **case.params)
    m = _MODULES[key]
    extra = {"threads": 1} if backend == "cpu" else {}
    y, saved = m.forward(*case.inputs, **extra)
    grads = m.backward(g, saved, **extra)
    return y, [grads[i] for i in case.wrt]


def per_element_torch(case: Case, g, lanes: int = 1):
    """PyTorch on each element alone (its scalar path; lanes > 1: the element repeated lanes
    times in a contiguous tensor, whose first copy PyTorch computes in its SIMD lanes), for
    elementwise ops: the output, and the gradients where no input is broadcast (None for a
    broadcast input's)."""
    shape = np.broadcast_shapes(*(a.shape for a in case.inputs))
    full = [np.broadcast_to(a, shape).reshape(-1) for a in case.inputs]
    ys, grads = [], [[] for _ in case.wrt]
    for k in range(int(np.prod(shape))):
        y, gr = torch_run(case, np.repeat(g.reshape(-1)[k:k + 1], lanes), [np.repeat(a[k:k + 1], lanes) for a in full])
        ys.append(y.reshape(-1)[:1])
        for j, v in enumerate(gr):
            grads[j].append(None if v is None else v.reshape(-1)[:1])
    grads = [np.concatenate(v).reshape(shape) if case.inputs[i].shape == shape else None
             for i, v in zip(case.wrt, grads)]
    return np.concatenate(ys).reshape(shape), grads


def xla_shape_contradiction(case: Case, g, got, want) -> bool:
    """symgrad equals JAX's own sum of the same per-element gradients, each output's terms alone
    as one row (a 1-d reduce_sum), where the broadcast input's gradient (one reduce over several
    dims) differs: XLA's order depending on the shape (docs/conventions.md, broadcast_sum)."""
    jax, jnp = _jnp()
    shape = np.broadcast_shapes(*(a.shape for a in case.inputs))
    full = [jnp.asarray(np.broadcast_to(a, shape)) for a in case.inputs]
    out, vjp = jax.vjp(case.jax_fn, *full)
    if not same_bits(got[0], np.asarray(out)):
        return False
    terms = [np.asarray(t) for t in vjp(jnp.asarray(g))]
    rows = [_rows_summed(t, x.shape) if x.shape != shape else t for x, t in zip(case.inputs, terms)]
    return all(same_bits(a, r) for a, r in zip(got[1], rows))


def _rows_summed(terms: np.ndarray, shape: tuple) -> np.ndarray:
    """JAX's reduce_sum of each output's terms alone (row-major order, one 1-d reduce each)."""
    jax, jnp = _jnp()
    full = (1,) * (terms.ndim - len(shape)) + tuple(shape)
    axes = [d for d in range(terms.ndim) if full[d] == 1 and terms.shape[d] != 1]
    kept = [d for d in range(terms.ndim) if d not in axes]
    rows = np.transpose(terms, kept + axes).reshape(int(np.prod([terms.shape[d] for d in kept])),
                                                    int(np.prod([terms.shape[d] for d in axes])))
    return np.array([np.asarray(jax.lax.reduce_sum(jnp.asarray(r), (0,))) for r in rows],
                    dtype=terms.dtype).reshape(shape)


LANES = 64  # elements of a contiguous tensor whose first PyTorch computes in SIMD lanes (any ISA)


def lane_contradiction(case: Case, g, got, want) -> bool:
    """symgrad equals PyTorch on each element alone, on one path for every element (its scalar
    path, or its SIMD lanes: the element repeated in a contiguous tensor), where the whole tensor
    differs: PyTorch contradicting itself by position (README, Framework conventions)."""
    def equal(alone) -> bool:
        return same_bits(got[0], alone[0]) and all(
            same_bits(a, w if o is None else o) for a, w, o in zip(got[1], want[1], alone[1]) if w is not None)
    return any(equal(per_element_torch(case, g, lanes)) for lanes in (1, LANES))


# ------------------------------------------------------------------ the run

class Tally:
    FIELDS = ("samples", "fwd_equal", "bwd_equal", "differing", "nan", "contradiction", "documented", "errors",
              "refused")

    def __init__(self):
        self.n = dict.fromkeys(self.FIELDS, 0)
        self.examples: list[str] = []


def compare(case, g, want, backend, convention, tally, framework, label):
    try:
        got = symgrad_run(case, g, backend, convention)
    except TypeError as e:
        if "NumPy backend only" in str(e):  # documented: the cpu backend refuses, naming backend='numpy'
            tally.n["refused"] += 1
            return
        _error(tally, label, e)
        return
    except Exception as e:  # symgrad refusing what the framework computes
        _error(tally, label, e)
        return
    _tally(case, g, want, got, tally, framework, backend, label)


def documented(case: Case, framework: str, backend: str):
    """The exception docs/guarantees.md and docs/backends.md state for this case, or None."""
    half = np.asarray(case.inputs[0]).dtype.itemsize == 2  # float16, bfloat16: the framework's ops rounded as it does
    if case.op == "logsumexp" and not half:
        return "logsumexp's exp and log are NumPy's, not MKL VML's or XLA's (not bit for bit; bounded in ulps)"
    return None


def _error(tally, label, e):
    tally.n["samples"] += 1
    tally.n["differing"] += 1
    tally.n["errors"] += 1
    if len(tally.examples) < 2:
        tally.examples.append(f"{label}: {type(e).__name__}: {str(e)[:160]}")


def _tally(case, g, want, got, tally, framework, backend, label):
    tally.n["samples"] += 1
    fwd = same_bits(got[0], want[0])
    bwd = all(w is None or same_bits(a, w) for a, w in zip(got[1], want[1]))
    tally.n["fwd_equal"] += fwd
    tally.n["bwd_equal"] += bwd
    if fwd and bwd:
        return
    tally.n["differing"] += 1
    arrays = [*case.inputs, got[0], want[0], *got[1], *want[1]]
    if any(a is not None and _floating(a) and np.isnan(np.asarray(a, np.float64)).any() for a in arrays):
        tally.n["nan"] += 1
        return
    if documented(case, framework, backend):
        tally.n["documented"] += 1
        return
    if framework == "torch" and case.elementwise and np.asarray(got[0]).size <= 4096:
        if lane_contradiction(case, g, got, want):
            tally.n["contradiction"] += 1
            return
    if framework == "jax" and len(case.inputs) == 2 and case.elementwise and \
            case.inputs[0].shape != case.inputs[1].shape and np.asarray(got[0]).size <= 4096:
        if xla_shape_contradiction(case, g, got, want):
            tally.n["contradiction"] += 1
            return
    if len(tally.examples) < 3:
        tally.examples.append(f"{label}: forward {'equal' if fwd else 'differs'}, "
                              f"backward {'equal' if bwd else 'differs'}")


def spread(samples: list, limit: int) -> list:
    if len(samples) <= limit:
        return samples
    step = len(samples) / limit
    return [samples[int(i * step)] for i in range(limit)]


def run(args) -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    entries = {o.name + (f".{o.variant_test_name}" if o.variant_test_name else ""): o for o in op_db}
    adapters = ADAPTERS()
    wanted = [n for n in adapters if not args.only or any(o in n for o in args.only)]
    tallies: dict = defaultdict(Tally)
    configs: dict = defaultdict(set)
    for name in wanted:
        info = entries.get(name)
        if info is None:
            print(f"(no OpInfo entry {name} in this PyTorch)")
            continue
        for dname in args.dtypes:
            tdtype = getattr(torch, dname)
            if tdtype not in info.supported_dtypes("cpu"):
                continue
            samples = spread(list(info.sample_inputs("cpu", tdtype, requires_grad=False)), args.limit)
            for k, s in enumerate(samples):
                made = adapters[name](s)
                if isinstance(made, str):
                    tallies[("skipped", name, dname, made)].n["samples"] += 1
                    continue
                for vname in VARIANTS:
                    rng = np.random.default_rng([k, VARIANTS.index(vname)])
                    case = variant(made, vname, rng)
                    _one(case, args, rng, tallies, configs, name, dname, f"{name} {dname} #{k} {vname}")
    return tallies


def _one(case, args, rng, tallies, configs, name, dname, label):
    for framework in args.frameworks:
        fn = case.torch_fn if framework == "torch" else case.jax_fn
        if fn is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                shape = output_shape(case, framework)
        except Exception:
            continue  # a setting the framework refuses
        g = np.asarray(rng.standard_normal(shape)).astype(case.inputs[0].dtype)
        try:
            want = torch_run(case, g) if framework == "torch" else jax_run(case, g)
        except Exception:
            continue
        for backend in args.backends:
            if backend == "cpu":
                seen = configs[(framework, case.op)]
                if case.key() not in seen and len(seen) >= args.cpu_configs:
                    continue
                seen.add(case.key())
            compare(case, g, want, backend, framework, tallies[(framework, name, dname, backend)],
                    framework, f"{label} {backend}")


def output_shape(case, framework: str) -> tuple:
    if framework == "torch":
        with torch.no_grad():
            out = case.torch_fn(*[to_torch(a) for a in case.inputs])
        return tuple((out[0] if isinstance(out, tuple) else out).shape)
    _, jnp = _jnp()
    return tuple(case.jax_fn(*[jnp.asarray(a) for a in case.inputs]).shape)


def report(tallies: dict) -> None:
    print("| framework | OpInfo entry | dtype | backend | samples | forward equal | backward equal | "
          "differing | of which NaN | of which self-contradiction | of which documented exception | errors | "
          "refused (NumPy backend only) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    total = dict.fromkeys(Tally.FIELDS, 0)
    for key in sorted(k for k in tallies if k[0] != "skipped"):
        t = tallies[key].n
        for f in Tally.FIELDS:
            total[f] += t[f]
        print(f"| {' | '.join(key)} | " + " | ".join(str(t[f]) for f in Tally.FIELDS) + " |")
    print(f"\ntotal: {total['samples']} sample runs, {total['differing']} differing: {total['nan']} involve NaN, "
          f"{total['contradiction']} are documented framework self-contradictions, "
          f"{total['documented']} documented exceptions, "
          f"{total['differing'] - total['nan'] - total['contradiction'] - total['documented']} others ({total['errors']} symgrad errors); "
          f"{total['refused']} refused by the cpu backend as documented (bfloat16 added in bfloat16: NumPy backend only)")
    skipped = [(k, v.n["samples"]) for k, v in tallies.items() if k[0] == "skipped"]
    for (_, name, dname, why), n in sorted(skipped):
        print(f"left out: {name} {dname}: {n} samples ({why})")
    for key in sorted(k for k in tallies if k[0] != "skipped"):
        for line in tallies[key].examples:
            print(f"example: {key[0]} {line}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="at most 4 samples per op and dtype, 1 cpu configuration per op")
    ap.add_argument("--limit", type=int, default=24, help="samples per OpInfo entry and dtype (spread over the list)")
    ap.add_argument("--cpu-configs", type=int, default=3, help="op configurations the cpu backend compiles per op")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="OpInfo entries whose name contains one of these")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--backends", nargs="+", default=["numpy", "cpu"], choices=("numpy", "cpu"))
    ap.add_argument("--frameworks", nargs="+", default=["torch", "jax"], choices=("torch", "jax"))
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.cpu_configs = min(args.limit, 4), min(args.cpu_configs, 1)
    _imports()
    if "jax" in args.frameworks:
        try:
            _jnp()
        except ImportError:
            print('(no JAX: pip install ".[jax]"; the JAX rows are left out)')
            args.frameworks = [f for f in args.frameworks if f != "jax"]
    torch.set_num_threads(1)
    start = time.time()
    tallies = run(args)
    report(tallies)
    print(f"\n{time.time() - start:.0f} s (limit {args.limit} samples per entry and dtype, "
          f"cpu backend on {args.cpu_configs} configuration(s) per op)")


if __name__ == "__main__":
    main()
