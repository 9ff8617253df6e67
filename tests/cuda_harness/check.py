"""Compare a generated CUDA module with the NumPy module of the same op, bit for bit.

Used with the CPU stand-in for CuPy (``fake_cupy``) in the normal test suite and with CuPy on a
GPU in the tests marked ``gpu``.  The NumPy module is the reference: float64 and float32 inputs
are compared in their own type; float16 inputs (which the CUDA kernels compute in float32 and
round once) are compared with the NumPy module run in float32 on the same values, rounded to
float16, except for an elementwise op whose NumPy module computes float16 in float16, without a
convention or under a preset that does (``half_in_numpy``: NumPy's float16 with constants rounded
to float16, as JAX): compared with the NumPy module run in float16 itself.  Values are equal bit for bit, the sign of zero included; any
NaN equals any NaN; the exponential piece of elu and celu (EXP_OPS) within EXP_ULPS.
"""

from __future__ import annotations

import numpy as np

import symgrad
from symgrad import backends, catalog
from symgrad.ops import OPS, resolve
from symgrad.policy import DEFAULT_NAN, NAN_RULES

KINKS = np.array([-2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0, 7.0])
# issue 8: NaN, +-inf, -0.0, the smallest subnormal and the largest finite value (float64; each
# dtype rounds them on conversion, the same for both backends)
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324, 1.7976931348623157e308, -1.7976931348623157e308])


def to_device(cp, a: np.ndarray, layout: str = "contiguous"):
    """a on the device: C-contiguous, channels-last (N, ..., C in memory), or strided."""
    if layout == "contiguous":
        return cp.asarray(np.array(a, order="C"))
    if layout == "channels_last":
        axes = (0,) + tuple(range(2, a.ndim)) + (1,)
        return cp.ascontiguousarray(cp.asarray(a).transpose(axes)).transpose(tuple(int(i) for i in np.argsort(axes)))
    if layout == "strided":  # every other element of a twice larger buffer along the last axis
        big = cp.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
        big[..., ::2] = cp.asarray(a)
        return big[..., ::2]
    raise ValueError(layout)


def to_host(cp, a) -> np.ndarray:
    return np.asarray(cp.asnumpy(a)) if hasattr(cp, "asnumpy") else np.asarray(a)


# the ops with an exponential piece (elu, celu: finite x < 0), where C's exp/expm1 and NumPy's may
# differ in the last bits: within test_elu30's ulps there (the largest it states, JAX's: the same
# libm against NumPy question; the jax preset computes float16 in float16), bit for bit everywhere
# else (the kink, NaN, +-inf, x > 0)
EXP_OPS = ("elu", "celu")
EXP_ULPS = {np.dtype(np.float64): 5, np.dtype(np.float32): 7, np.dtype(np.float16): 3}


def mismatch(got: np.ndarray, want: np.ndarray, loose=None) -> str:
    """'' if got equals want bit for bit (any NaN equal to any NaN), or within EXP_ULPS of want
    where ``loose`` (a mask) holds, else a description."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    same = ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
    if loose is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            near = np.abs(got.astype(np.float64) - want.astype(np.float64)) <= \
                EXP_ULPS[want.dtype] * np.spacing(np.abs(want)).astype(np.float64)
        same |= np.broadcast_to(loose, same.shape) & near
    if same.all():
        return ""
    bad = np.argwhere(~same)[:5]
    return "; ".join(f"at {tuple(i)}: {got[tuple(i)]!r} != {want[tuple(i)]!r}" for i in bad) + \
        f" ({(~same).sum()} of {same.size} differ)"


def inputs_for(rng, op: str, shapes, specials: bool) -> list[np.ndarray]:
    """Tie-heavy float64 inputs: kink values for one-input elementwise ops, small integers else;
    with NaN and +-inf sprinkled in when `specials`."""
    out = []
    for k, shape in enumerate(shapes):
        n = int(np.prod(shape))
        if OPS[op].inputs[k] in OPS[op].constant_inputs:  # fractional pooling's samples, in [0, 1)
            out.append(rng.random(shape))
            continue
        if len(shapes) == 1 and OPS[op].kind == "elementwise":
            x = rng.choice(KINKS, size=n)
        else:
            x = rng.integers(0, 3, size=n).astype(np.float64)
        if specials and n:
            where = rng.random(n) < 0.15
            x[where] = rng.choice(SPECIALS, size=int(where.sum()))
        out.append(x.reshape(shape))
    return out


def settings_of(ties) -> dict:
    """load()'s settings: a tie policy name, or a dict of ties/nan/convention."""
    return dict(ties) if isinstance(ties, dict) else {"ties": ties}


def half_in_numpy(op: str, params: dict, ties) -> bool:
    """Whether the NumPy module computes float16 in float16, as the C kernels then do: an
    elementwise op without a convention (NumPy's float16) or under a preset whose float16 is not
    computed in float32 (Preset.half "half")."""
    resolved = resolve(op, **settings_of(ties), **params)
    return resolved.spec.kind == "elementwise" and not resolved.half_in_float


def compare(cp, op: str, params: dict, ties, inputs: list[np.ndarray], dtype,
            layout: str = "contiguous", seed: int = 0, module=None, half: bool = False) -> list[str]:
    """Run both backends on the inputs (cast to dtype); return a list of mismatches ([] if none).
    ``ties`` is a tie policy or a dict of load()'s settings (ties, nan, convention); ``half``:
    float16 backward and jvp are compared with the NumPy module run in float16 whatever the op
    (the cpu backend's max pooling adds its windows' terms in float16, each add rounded, as that
    module does), forward as without it."""
    numpy_module = symgrad.load(op, **settings_of(ties), **params)
    cuda_module = module or symgrad.load(op, backend="cuda", **settings_of(ties), **params)
    ref = np.float32 if dtype == np.float16 and not half_in_numpy(op, params, ties) else dtype
    sums = dtype if half else ref  # the type of the NumPy module's run for backward and jvp
    with np.errstate(over="ignore"):  # the largest float64 becomes inf in float32/float16, meant so
        xs = [x.astype(dtype) for x in inputs]
    # an output that overflows is +-inf (leaky_relu's slope 2 times the largest float), meant so
    with np.errstate(over="ignore"):
        y_ref, saved_ref = numpy_module.forward(*[x.astype(ref) for x in xs])
        saved_sums = saved_ref if sums == ref else numpy_module.forward(*[x.astype(sums) for x in xs])[1]
    g = np.random.default_rng(seed).integers(-3, 4, size=y_ref.shape).astype(dtype)
    grads_ref = numpy_module.backward(g.astype(sums), saved_sums)

    y, saved = cuda_module.forward(*[to_device(cp, x, layout) for x in xs])
    grads = cuda_module.backward(to_device(cp, g, layout if g.ndim == xs[0].ndim else "contiguous"), saved)
    problems = []
    tag = f"{op} {params} {ties} {np.dtype(dtype).name} {layout}"
    loose = None  # the exponential piece: within EXP_ULPS
    if op in EXP_OPS:
        with np.errstate(invalid="ignore"):
            loose = np.isfinite(xs[0]) & (xs[0] < 0)
    m = mismatch(to_host(cp, y), y_ref.astype(dtype), loose)
    if m:
        problems.append(f"{tag}: forward: {m}")
    if len(grads) != len(grads_ref):
        problems.append(f"{tag}: {len(grads)} gradients, want {len(grads_ref)}")
    for k, (a, b) in enumerate(zip(grads, grads_ref)):
        if a is None or b is None:  # an input with no gradient (the samples of fractional pooling)
            if (a is None) != (b is None):
                problems.append(f"{tag}: gradient {k}: {a!r} where NumPy gives {b!r}")
            continue
        m = mismatch(to_host(cp, a), b.astype(dtype), loose)
        if m:
            problems.append(f"{tag}: gradient {k}: {m}")
    # forward mode: small-integer tangents of every input, in the inputs' layout
    ts = [None if OPS[op].inputs[k] in OPS[op].constant_inputs else  # no tangent: integer windows
          np.random.default_rng(seed + 1 + k).integers(-3, 4, size=x.shape).astype(dtype)
          for k, x in enumerate(xs)]
    jvp_ref = numpy_module.jvp(*[t if t is None else t.astype(sums) for t in ts], saved_sums)
    jvp = cuda_module.jvp(*[t if t is None else to_device(cp, t, layout) for t in ts], saved)
    m = mismatch(to_host(cp, jvp), jvp_ref.astype(dtype), loose)
    if m:
        problems.append(f"{tag}: jvp: {m}")
    if "index" in saved_ref._fields and "index" in saved._fields:
        got_index = to_host(cp, saved.index)
        if got_index.dtype != saved_ref.index.dtype:
            problems.append(f"{tag}: saved index dtype {got_index.dtype}, NumPy saves {saved_ref.index.dtype}")
        if not np.array_equal(got_index.reshape(-1), np.asarray(saved_ref.index).reshape(-1)):
            problems.append(f"{tag}: saved index differs from the NumPy module's")
    if layout == "channels_last" and xs[0].ndim >= 3:
        for name, a in (("output", y), ("grad_x", grads[0])):
            axes = (0,) + tuple(range(2, a.ndim)) + (1,)
            if not a.transpose(axes).flags.c_contiguous:
                problems.append(f"{tag}: {name} is not channels-last")
    return problems


def _channels_last_ok(op: str, shapes) -> bool:
    spec = OPS[op]
    if spec.kind in ("pool", "adaptive", "fractional"):
        return len(shapes[0]) == spec.spatial + 2
    return spec.kind == "maxout" and len(shapes[0]) >= 3


def every_comparison(cp, op: str, params: dict, shapes, ties, setattr_) -> list[str]:
    """All comparisons of one op and policy: tie-heavy inputs without and with NaN/inf, float64,
    float32 and float16; channels-last (pools, maxout) or strided (elementwise) inputs; the
    64-bit index kernels; reductions in several passes.  setattr_(obj, name, value) changes a
    loader constant for the rest of the test (pytest's monkeypatch.setattr)."""
    rng = np.random.default_rng(sum(map(ord, f"{op}{params}{ties}")))
    module = symgrad.load(op, backend="cuda", **settings_of(ties), **params)
    problems = []
    for specials in (False, True):
        inputs = inputs_for(rng, op, shapes, specials)
        for dtype in (np.float64, np.float32, np.float16):
            problems += compare(cp, op, params, ties, inputs, dtype, module=module)
    if _channels_last_ok(op, shapes):
        for dtype in (np.float32, np.float16):
            problems += compare(cp, op, params, ties, inputs, dtype, "channels_last", module=module)
    if OPS[op].kind == "elementwise" and len(shapes) == 1:
        problems += compare(cp, op, params, ties, inputs, np.float32, "strided", module=module)
    if OPS[op].kind != "reduction":  # the 64-bit index kernels
        setattr_(module, "INDEX32_LIMIT", 0)
        problems += compare(cp, op, params, ties, inputs, np.float32, module=module)
        if _channels_last_ok(op, shapes):
            problems += compare(cp, op, params, ties, inputs, np.float64, "channels_last", module=module)
    else:  # reductions in several passes
        setattr_(module, "CHUNK", 2)
        for dtype in (np.float64, np.float16):
            problems += compare(cp, op, params, ties, inputs, dtype, module=module)
    return problems


# ----------------------------------------------------------------------------- the cases

def _key(op, params):
    return (op, repr(resolve(op, **params).params))


def _extra_shapes(op):
    kind = op.spec.kind
    if kind == "pool":
        return [(2, 2) + (5,) * op.spec.spatial]
    if kind == "adaptive":  # windows that overlap and differ in size along every axis
        return [(2, 2) + tuple((o or 3) + 2 + a for a, o in enumerate(op.params["output_size"]))]
    if kind == "fractional":  # overlapping windows where kernel_size exceeds the step
        spatial = tuple(7 + a for a in range(op.spec.spatial))
        return [(2, 2) + spatial, (2, 2, op.spec.spatial)]
    if kind == "maxout":
        return [(2, 2 * op.params["pieces"], 3)]
    if kind == "reduction":
        return [(3, 4, 5)]
    return [(3, 4)] * len(op.spec.inputs)


def cases():
    """(op, params, input shapes): the test tables of conftest, and every other (op, parameters)
    of the catalog."""
    from conftest import ELEMENTWISE, WINDOWED

    out = [(op, params, shapes) for op, params, shapes in ELEMENTWISE]
    out += [(op, params, [shape]) for op, params, shape in WINDOWED]
    seen = {_key(op, params) for op, params, _ in out}
    for entry in catalog.entries():
        if entry.spec.kind in ("unpool", "logsumexp"):  # tests/test_unpool_logsumexp.py
            continue
        if entry.spec.kind == "ranking":  # the order statistics: tests/test_cuda_order.py
            continue
        if entry.spec.kind == "segment":  # an index among the inputs: tests/test_cuda_segment.py
            continue
        if not backends.get("cuda").builds(entry):
            continue
        params = {p.name: entry.params[p.name] for p in entry.spec.params
                  if p.required or entry.params[p.name] != p.default}
        if params.get("stride") == params.get("kernel_size"):
            params.pop("stride", None)
        if _key(entry.name, params) not in seen:
            seen.add(_key(entry.name, params))
            out.append((entry.name, params, _extra_shapes(entry)))
    return out


CONVENTIONS = ("torch", "jax")  # the framework presets


def nan_cases(cases):
    """From cases (cases() below), one case of each geometry (elementwise with one and two inputs, reduction, pooling with
    padding, adaptive pooling, maxout, fractional pooling) under every tie policy and NaN rule it allows besides the
    default, with PyTorch's (-inf padding never wins) and JAX's padding (-inf takes part)."""
    picked = {}
    for op, params, shapes in cases:
        kind = (OPS[op].kind, len(shapes), "padding" in params)
        if kind in (("elementwise", 1, False), ("elementwise", 2, False), ("reduction", 1, False),
                    ("pool", 1, True), ("adaptive", 1, False), ("maxout", 1, False),
                    ("fractional", 2, False)):
            picked.setdefault(kind, (op, params, shapes))
    out = []
    for op, params, shapes in picked.values():
        for nan, rule in NAN_RULES.items():
            for ties in rule.policies:
                for convention in ((None, "jax") if OPS[op].kind == "pool" else (None,)):
                    st = {"ties": ties, "nan": nan, "convention": convention}
                    try:
                        resolve(op, **st, **params)
                    except ValueError:  # not allowed for this op (a reduction's first/last)
                        continue
                    if nan != DEFAULT_NAN or convention:
                        out.append((op, params, shapes, st))
    return out
