"""Op specs: what each op computes, as data.

Every op is one ``OpSpec`` in ``OPS``.  An op's forward is one of three shapes:

* ``elementwise``: a nested max/min (``MaxOf``/``MinOf``) of pieces built from the inputs and
  constants, e.g. relu = max(0, x), clamp = min(max(x, min), max).  The argument order is part of
  the definition: with the tie policy it fixes the gradient at a kink.
* ``pool`` / ``maxout``: the extremum of a static window of input elements, numbered in row-major
  (scan) order of the window.
* ``reduction``: the extremum of the elements along some dims; the window length is known only
  at run time, so it is derived on a representative window and lowered to a form valid for any
  length.
* ``fractional``: fractional max pooling: static windows of kernel_size elements whose starts, per
  (N, C) plane, follow PyTorch's pseudo-random sequence from the ``random_samples`` input (an input,
  not differentiable: the windows are integers).
* ``adaptive``: adaptive max pooling, PyTorch's windows for a given output size (start
  floor(i*L/out), end ceil((i+1)*L/out) per axis: they may overlap and differ in size, and depend
  on the input length L known only at run time): derived on a representative window, as the
  reductions are.

Parameters are named and defaulted as in ``torch.nn.functional`` (``torch.amax`` for reductions).
``resolve`` validates them and returns an ``Op``: the spec, its normalized parameters and the
tie policy, which is everything that affects generated code.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy as sp

from . import policy as _policy
from .conventions import preset_for
from .indicators import Literal, MaxOf, MinOf
from .kinds import FRACTIONAL_WINDOWS, KINDS, Kind  # noqa: F401 (FRACTIONAL_WINDOWS: re-exported)

MAX_WINDOW = 1024  # the largest static window (pool, maxout) symgrad derives
MAX_INT = 2**31 - 1  # the largest size parameter: index arithmetic stays far inside int64


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "ints" | "int" | "bool" | "float" | "optfloat" | "dim" | "ratios"
    default: Any
    help: str
    minimum: int | None = None
    required: bool = False
    none_entries: bool = False  # "ints": a tuple may hold None entries (adaptive output_size)
    # "ints": a tuple may also hold this many leading entries, dropped (unpooling's output_size may
    # be the whole (N, C, *spatial) shape, as PyTorch's _unpool_output_size takes it)
    leading: int = 0


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str  # "elementwise" | "pool" | "maxout" | "fractional" | "reduction" | "adaptive" | ...
    summary: str
    inputs: tuple[str, ...] = ("x",)
    params: tuple[Param, ...] = ()
    extremum: str = "max"  # for pool, maxout, reduction
    spatial: int = 0  # pooling dims
    forward: Callable[[dict, tuple[sp.Symbol, ...]], sp.Expr] | None = None
    # the forward a framework preset derives, where it differs: parameters as the framework
    # computes with them (a slope of 0 as a Literal: x * 0, not SymPy's 0)
    framework_forward: Callable[[dict, tuple[sp.Symbol, ...]], sp.Expr] | None = None
    check: Callable[[dict], None] | None = None
    torch_name: str = ""
    # ops whose tie policies or NaN rules are restricted (unpool, logsumexp): the ones allowed,
    # the first being the default; empty: every policy, the usual default
    policies: tuple[str, ...] = ()
    nan_rules: tuple[str, ...] = ()
    policies_why: str = ""
    nan_why: str = ""
    constant_inputs: tuple[str, ...] = ()  # inputs with no gradient (backward returns None)
    # parameters the op fixes (not the caller's to set), in op.params as the kind's code reads them
    # (max/min: a reduction over every dim, as torch.max(x) without dim)
    fixed: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    @property
    def strategy(self) -> Kind:
        """What the op's kind decides (kinds.py)."""
        return KINDS[self.kind]


ORDERS = ("given", "reversed")


@dataclass(frozen=True)
class Op:
    """One concrete op: spec, normalized parameters, tie policy, NaN rule, argument order.

    ``convention`` names the framework preset the settings came from (None: plain policy), and
    ``origin`` says for each of ties/nan/order whether the preset or an explicit argument set it.
    """

    spec: OpSpec
    params: dict = field(hash=False)
    ties: str
    nan: str = "dominate"
    order: str = "given"
    convention: str | None = None
    origin: tuple = ()
    padding_mode: str = "never_wins"  # pooling: padding never wins, or is -inf and takes part
    # elementwise: which of two equal operands each max/min step of the forward returns
    # (conventions.ZERO_RULES; None: NumPy's np.maximum/np.minimum, as documented)
    zeros: str | None = None
    # elementwise: how the gradient's terms are put together (lower.GRADIENT_FORMS), which decides
    # the sign of a zero gradient
    gradient: str = "sum"
    # elementwise: float16 computed in float32 with float32 constants, rounded once (Preset.half)
    half_in_float: bool = False
    # windows: the value an element's gradient starts from (conventions.GRAD_STARTS)
    grad_start: str = "+0"
    # windows, bfloat16: how an element's windows' gradients are added (conventions.BFLOAT16_ADDS)
    bfloat16_adds: str = "float32"
    # adaptive windows: the order an element's windows' gradients are added (conventions.GRAD_ORDERS)
    grad_order: str = "output"
    # reductions: how jvp adds a slice's terms (conventions.TANGENT_SUMS)
    tangent_sum: str = "weights"
    # elementwise with broadcasting: how a broadcast input's gradient is summed
    # (conventions.BROADCAST_SUMS)
    broadcast_sum: str = "numpy"
    # order statistics: how the framework computes what a policy alone does not say
    # (conventions.ORDER_FORMS)
    order_form: str = ""
    # elementwise, a whole-bfloat16 call: the forward's zero rule where it differs from zeros
    # (Preset.bfloat16_zeros)
    bfloat16_zeros: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{self.name}({ps}) ties={self.ties} nan={self.nan} order={self.order}"

    def window_size(self) -> int:
        return self.spec.strategy.window(self)


# ----------------------------------------------------------------------------- validation

def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _norm_ints(op: str, p: Param, v, dims: int) -> tuple[int, ...]:
    want = f"an int >= {p.minimum} or a tuple of {dims} such ints"
    if p.none_entries:
        want += " (an entry may be None: the input's size)"
    if p.leading:
        want += f" (or {dims + p.leading} ints, whose first {p.leading} are dropped)"
    given = v
    if _is_int(v):
        v = (int(v),) * dims
    elif isinstance(v, (tuple, list)) and all(_is_int(e) for e in v):
        if p.leading and len(v) == dims + p.leading:
            v = tuple(v)[p.leading:]
        if len(v) == 1:
            v = tuple(v) * dims
        if len(v) != dims:
            raise ValueError(f"{op}: {p.name} must be {want}, got {tuple(v)!r} ({len(v)} values)")
        v = tuple(int(e) for e in v)
    else:
        raise TypeError(f"{op}: {p.name} must be {want}, got {v!r}")
    if any(e < p.minimum for e in v):
        raise ValueError(f"{op}: {p.name} must be {want}, got {given!r}")
    if any(e > MAX_INT for e in v):
        raise ValueError(f"{op}: {p.name} must be at most {MAX_INT}, got {given!r}")
    return v


def _norm_ints_or_none(op: str, p: Param, v, dims: int) -> tuple:
    """An "ints" parameter whose tuple may hold None entries (None: the input's own size)."""
    if isinstance(v, (tuple, list)) and any(e is None for e in v):
        want = (f"an int >= {p.minimum} or a tuple of {dims} such ints (an entry may be None: the "
                f"input's size)")
        if not all(e is None or _is_int(e) for e in v):
            raise TypeError(f"{op}: {p.name} must be {want}, got {v!r}")
        if len(v) not in (1, dims):
            raise ValueError(f"{op}: {p.name} must be {want}, got {tuple(v)!r} ({len(v)} values)")
        given, v = v, tuple(v) * (dims // len(v))
        if any(e is not None and not p.minimum <= e <= MAX_INT for e in v):
            raise ValueError(f"{op}: {p.name} must be {want} (at most {MAX_INT}), got {given!r}")
        return tuple(None if e is None else int(e) for e in v)
    return _norm_ints(op, p, v, dims)


def _norm_ratios(op: str, p: Param, v, dims: int):
    """A tuple of ``dims`` real numbers strictly between 0 and 1 (one number: every dim), or None."""
    if v is None:
        return None
    want = f"a number in (0, 1) or a tuple of {dims} such numbers"
    given = v
    if _is_real(v):
        v = (v,) * dims
    elif isinstance(v, (tuple, list)) and v and all(_is_real(e) for e in v):
        v = tuple(v) * (dims if len(v) == 1 else 1)
        if len(v) != dims:
            raise ValueError(f"{op}: {p.name} must be {want}, got {given!r} ({len(given)} values)")
    else:
        raise TypeError(f"{op}: {p.name} must be {want}, got {given!r}")
    if not all(0 < e < 1 for e in v):
        raise ValueError(f"{op}: {p.name} must be {want}, got {given!r}")
    return tuple(float(e) for e in v)


def _norm_value(op: str, p: Param, v, dims: int):
    if p.kind == "ints" and p.none_entries:
        return _norm_ints_or_none(op, p, v, dims)
    if p.kind == "ints":
        return _norm_ints(op, p, v, dims)
    if p.kind == "int":
        if not _is_int(v):
            raise TypeError(f"{op}: {p.name} must be an int >= {p.minimum}, got {v!r}")
        if v < p.minimum or v > MAX_INT:
            raise ValueError(f"{op}: {p.name} must be an int >= {p.minimum} (at most {MAX_INT}), "
                             f"got {v!r}")
        return int(v)
    if p.kind == "bool":
        if not isinstance(v, bool):
            raise TypeError(f"{op}: {p.name} must be True or False, got {v!r}")
        return v
    if p.kind in ("float", "optfloat"):
        if v is None and p.kind == "optfloat":
            return None
        if not _is_real(v):
            kind = "a real number or None" if p.kind == "optfloat" else "a real number"
            raise TypeError(f"{op}: {p.name} must be {kind}, got {v!r}")
        try:
            finite = math.isfinite(float(v))
        except OverflowError:  # an int beyond the float range
            finite = False
        if not finite:
            raise ValueError(f"{op}: {p.name} must be finite (within the float64 range), got {v!r}")
        if _is_int(v) and abs(v) <= 2**53:
            return int(v)  # exact as a float, and named without a fraction
        return float(v)
    if p.kind == "ratios":
        return _norm_ratios(op, p, v, dims)
    if p.kind == "dim":
        if v is None or (isinstance(v, (tuple, list)) and len(v) == 0):
            return None
        if _is_int(v):
            return (int(v),)
        if isinstance(v, (tuple, list)) and v and all(_is_int(e) for e in v):
            v = tuple(int(e) for e in v)
            if len(set(v)) != len(v):
                raise ValueError(f"{op}: dim must not repeat a dimension, got {v!r}")
            return v
        raise TypeError(f"{op}: dim must be an int, a tuple of ints or None, got {v!r}")
    raise AssertionError(p.kind)


def resolve(name: object, ties: object = None, *, nan: object = None, order: object = None,
            convention: object = None, **params) -> Op:
    """Validate an op name, its settings and parameters; return the normalized ``Op``.

    A convention (framework preset) chooses ties, nan and order per op; an explicit ties=, nan= or
    order= overrides the preset's value.
    """
    if not isinstance(name, str):
        raise TypeError(f"op must be an op name (a string), got {name!r}")
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; expected one of: {', '.join(OPS)}")
    spec = OPS[name]
    preset = preset_for(convention, name, params)
    origin = []
    for key, given, default in (("ties", ties, _policy.DEFAULT_POLICY),
                                ("nan", nan, _policy.DEFAULT_NAN), ("order", order, "given")):
        if given is not None:
            origin.append((key, "explicit" if preset is None else f"explicit, overrides {convention}"))
        elif preset is not None:
            origin.append((key, f"convention {convention}"))
        else:
            origin.append((key, "default"))
    ties, nan = _restricted_settings(spec, ties, nan, preset)
    ties = _policy.check_policy(ties if ties is not None else (preset.ties if preset else None))
    try:
        nan = _policy.check_nan(nan if nan is not None else (preset.nan if preset else None), ties,
                                spec.nan_rules)
    except ValueError as exc:
        if preset is None or nan is not None:
            raise
        raise ValueError(f"{name}: convention={convention!r} uses {exc}") from None
    order = order if order is not None else (preset.order if preset else "given")
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if order != "given" and not spec.strategy.elementwise:
        raise ValueError(f"{name}: order={order!r} applies to elementwise ops; a window keeps its "
                         f"scan order, so order must be 'given'")
    spec.strategy.settings(name, ties, nan)
    known = {p.name for p in spec.params}
    unknown = sorted(set(params) - known)
    if unknown:
        expected = ", ".join(sorted(known)) or "no parameters"
        raise TypeError(f"{name}: unexpected parameter {unknown[0]!r}; {name} takes {expected}")
    norm = {}
    for p in spec.params:
        if p.name not in params or params[p.name] is None and p.kind != "optfloat":
            if p.required:
                raise TypeError(f"{name}: missing required parameter {p.name!r}")
            norm[p.name] = p.default
            continue
        norm[p.name] = _norm_value(name, p, params[p.name], spec.spatial)
    norm.update(spec.fixed)
    if spec.check:
        spec.check(norm)
    if norm.get("return_indices") and ties not in RETURN_INDICES_POLICIES:
        raise ValueError(f"{name}: return_indices=True needs one winner per window: ties must be "
                         f"{' or '.join(repr(t) for t in RETURN_INDICES_POLICIES)}, got ties={ties!r}")
    padding_mode = preset.padding if (preset and spec.strategy.preset_padding) else "never_wins"
    zeros = preset.zeros if preset else plain_zeros(spec, ties)
    gradient = "sum"
    if preset and spec.strategy.elementwise and not any(how.startswith("explicit") for _, how in origin):
        gradient = preset.gradient  # (how the framework forms it; with a setting overridden: "sum")
    half_in_float = bool(preset and spec.strategy.elementwise and preset.half == "float")
    grad_start = preset.grad_start if preset and not spec.strategy.elementwise else "+0"
    bfloat16_adds = preset.bfloat16_adds if preset else "float32"
    grad_order = preset.grad_order if preset else "output"
    tangent_sum = preset.tangent_sum if preset else "weights"
    broadcast_sum = preset.broadcast_sum if preset else "numpy"
    op = Op(spec, norm, ties, nan, order, convention if preset else None, tuple(origin), padding_mode,
            zeros, gradient, half_in_float, grad_start, bfloat16_adds, grad_order, tangent_sum,
            broadcast_sum, preset.order_form if preset and ties == preset.ties else "",
            bfloat16_zeros=preset.bfloat16_zeros if preset and spec.strategy.elementwise else None)
    if spec.strategy.static and op.window_size() > MAX_WINDOW:
        what = spec.strategy.window_param
        raise ValueError(f"{name}: {what} must give a window of at most {MAX_WINDOW} elements, got "
                         f"{what}={norm[what]!r} ({op.window_size()} elements)")
    return op


def plain_zeros(spec: OpSpec, ties: str) -> str | None:
    """The zeros rule of an op without a preset: None (NumPy's np.maximum/np.minimum) but for the
    kinds whose backends would otherwise disagree on a tie of +0 and -0 (Kind.first_zero: np.max's
    sign depends on its SIMD lanes): the first zero, or under ties 'last' the winner's, the last."""
    if not spec.strategy.first_zero:
        return None
    return "second" if ties == "last" else "first"


def _restricted_settings(spec: OpSpec, ties, nan, preset):
    """(ties, nan) for an op that allows only some policies or NaN rules (spec.policies,
    spec.nan_rules): the op's default when neither the caller nor a preset chose, a ValueError
    naming the allowed ones when the choice is not among them."""
    for what, given, allowed, why in (
            ("ties", ties, spec.policies, spec.policies_why),
            ("nan", nan, spec.nan_rules, spec.nan_why)):
        if not allowed:
            continue
        chosen = given if given is not None else (getattr(preset, what) if preset else None)
        if chosen is None:
            chosen = allowed[0]
        if isinstance(chosen, str) and chosen not in allowed:
            raise ValueError(f"{spec.name}: {what} must be {' or '.join(repr(a) for a in allowed)} "
                             f"({why}), got {what}={chosen!r}")
        if what == "ties":
            ties = chosen if given is None or isinstance(given, str) else given
        else:
            nan = chosen if given is None or isinstance(given, str) else given
    return ties, nan


# ----------------------------------------------------------------------------- forwards

def _num(v) -> sp.Expr:
    """A parameter value as a SymPy number (ints stay exact; floats keep their binary value)."""
    return sp.Integer(v) if isinstance(v, int) else sp.Float(v, 17)


def _clamp(x, lo, hi) -> sp.Expr:
    if lo is None:
        return MinOf(x, _num(hi))
    if hi is None:
        return MaxOf(x, _num(lo))
    return MinOf(MaxOf(x, _num(lo)), _num(hi))


def _leaky(params, xs, literal: bool = False):
    (x,) = xs
    a = params["negative_slope"]
    # x and a*x cross at 0; the upper envelope is max for a <= 1 and min for a > 1.
    # A slope of 0 under a preset: the frameworks compute x * 0 (NaN at +-inf, -0 for x < 0), which
    # SymPy would fold to 0; the slope stays a Literal, printed as its value
    slope = Literal("negative_slope", a) if literal and a == 0 else _num(a)
    return (MaxOf if a <= 1 else MinOf)(x, slope * x)


def _check_clamp(params):
    if params["min"] is None and params["max"] is None:
        raise ValueError("clamp: at least one of min and max must be given (not None)")


def _check_hardtanh(params):
    if params["min_val"] > params["max_val"]:
        raise ValueError(
            f"hardtanh: min_val must be <= max_val, got min_val={params['min_val']!r}, "
            f"max_val={params['max_val']!r}")


def _check_pool(spatial):
    def check(params):
        if params["stride"] is None:
            params["stride"] = params["kernel_size"]
        for k, p in zip(params["kernel_size"], params["padding"]):
            if p > k // 2:
                raise ValueError(
                    f"max_pool{spatial}d: padding must be at most half of kernel_size, got "
                    f"padding={params['padding']!r} for kernel_size={params['kernel_size']!r}")
    return check


def _check_fractional(spatial):
    def check(params):
        if (params["output_size"] is None) == (params["output_ratio"] is None):
            raise ValueError(f"fractional_max_pool{spatial}d: expected exactly one of output_size and "
                             f"output_ratio, got output_size={params['output_size']!r}, "
                             f"output_ratio={params['output_ratio']!r}")
    return check


def _pool_params(d: int) -> tuple[Param, ...]:
    return (
        Param("kernel_size", "ints", None, "window size (int or tuple)", 1, required=True),
        Param("stride", "ints", None, "window step (int or tuple; default kernel_size)", 1),
        Param("padding", "ints", (0,) * d, "implicit padding on both sides; never wins", 0),
        Param("dilation", "ints", (1,) * d, "spacing between window elements", 1),
        Param("ceil_mode", "bool", False, "use ceil instead of floor for the output size"),
        _RETURN_INDICES,
    )


# PyTorch's return_indices: forward's output is (output, indices), the flat position of each
# window's winner in its (N, C) plane (int64), as F.max_pool*d(return_indices=True) returns them
_RETURN_INDICES = Param("return_indices", "bool", False, "also return the winners' flat per-plane "
                        "indices (int64), as PyTorch: forward's output is (output, indices)")
RETURN_INDICES_POLICIES = ("first", "last")  # one winner per window


_RED = (
    Param("dim", "dim", None, "dim(s) to reduce (int, tuple, or none for all)"),
    Param("keepdim", "bool", False, "keep reduced dims with size 1"),
)


FMAX_NAN_WHY = ("fmax/fmin ignore NaN: a NaN loses to every number, so the output is NaN only "
                "where both operands are, and the gradient goes to the number (where both are NaN, "
                "to a); maximum/minimum are the NaN-propagating ops")


def _spec_list() -> list[OpSpec]:
    x = lambda xs: xs[0]  # noqa: E731
    specs = [
        OpSpec("maximum", "elementwise", "max(a, b), elementwise with broadcasting",
               inputs=("a", "b"), forward=lambda p, xs: MaxOf(*xs), torch_name="torch.maximum"),
        OpSpec("minimum", "elementwise", "min(a, b), elementwise with broadcasting",
               inputs=("a", "b"), forward=lambda p, xs: MinOf(*xs), torch_name="torch.minimum"),
        OpSpec("fmax", "elementwise", "max(a, b) ignoring NaN (NaN only where both are), "
               "elementwise with broadcasting", inputs=("a", "b"), forward=lambda p, xs: MaxOf(*xs),
               torch_name="torch.fmax", nan_rules=("lose",), nan_why=FMAX_NAN_WHY),
        OpSpec("fmin", "elementwise", "min(a, b) ignoring NaN (NaN only where both are), "
               "elementwise with broadcasting", inputs=("a", "b"), forward=lambda p, xs: MinOf(*xs),
               torch_name="torch.fmin", nan_rules=("lose",), nan_why=FMAX_NAN_WHY),
        OpSpec("relu", "elementwise", "max(0, x)",
               forward=lambda p, xs: MaxOf(sp.S.Zero, x(xs)), torch_name="F.relu"),
        OpSpec("clamp", "elementwise", "min(max(x, min), max); either bound may be None",
               params=(Param("min", "optfloat", None, "lower bound"),
                       Param("max", "optfloat", None, "upper bound")),
               forward=lambda p, xs: _clamp(x(xs), p["min"], p["max"]),
               check=_check_clamp, torch_name="torch.clamp"),
        OpSpec("hardtanh", "elementwise", "min(max(x, min_val), max_val)",
               params=(Param("min_val", "float", -1.0, "lower bound"),
                       Param("max_val", "float", 1.0, "upper bound")),
               forward=lambda p, xs: _clamp(x(xs), p["min_val"], p["max_val"]),
               check=_check_hardtanh, torch_name="F.hardtanh"),
        OpSpec("relu6", "elementwise", "min(max(x, 0), 6)",
               forward=lambda p, xs: _clamp(x(xs), 0, 6), torch_name="F.relu6"),
        OpSpec("leaky_relu", "elementwise",
               "max(x, negative_slope*x) (min for negative_slope > 1)",
               params=(Param("negative_slope", "float", 0.01, "slope for x < 0"),),
               forward=_leaky, framework_forward=lambda p, xs: _leaky(p, xs, literal=True),
               torch_name="F.leaky_relu"),
        OpSpec("abs", "elementwise", "max(x, -x)",
               forward=lambda p, xs: MaxOf(x(xs), -x(xs)), torch_name="torch.abs"),
        OpSpec("amax", "reduction", "max over dim(s)", params=_RED, torch_name="torch.amax"),
        OpSpec("amin", "reduction", "min over dim(s)", params=_RED, extremum="min",
               torch_name="torch.amin"),
        # torch.max(x) / torch.min(x) without dim: the same reduction as amax/amin over every dim,
        # an op of its own because PyTorch's backward differs (conventions.py: it splits among the
        # NaNs where amax gives NaN everywhere)
        OpSpec("max", "reduction", "max over every element (torch.max(x) without dim); a 0-d output",
               fixed=(("dim", None), ("keepdim", False)), torch_name="torch.max"),
        OpSpec("min", "reduction", "min over every element (torch.min(x) without dim); a 0-d output",
               extremum="min", fixed=(("dim", None), ("keepdim", False)), torch_name="torch.min"),
    ]
    for d in (1, 2, 3):
        specs.append(OpSpec(f"max_pool{d}d", "pool",
                            f"{d}-d max pooling over (N, C, ...) or (C, ...) inputs",
                            params=_pool_params(d), spatial=d, check=_check_pool(d),
                            torch_name=f"F.max_pool{d}d"))
    specs += _unpool_logsumexp_specs()
    for d in (1, 2, 3):
        specs.append(OpSpec(
            f"adaptive_max_pool{d}d", "adaptive",
            f"{d}-d adaptive max pooling to output_size over (N, C, ...) or (C, ...) inputs "
            f"(PyTorch's windows: they may overlap and differ in size)",
            params=(Param("output_size", "ints", None, "output size (int or tuple; a None entry "
                          "keeps that input size; 0: an empty output, as PyTorch)", 0, required=True,
                          none_entries=True),
                    _RETURN_INDICES),
            spatial=d, torch_name=f"F.adaptive_max_pool{d}d"))
    for d in (2, 3):
        specs.append(OpSpec(
            f"fractional_max_pool{d}d", "fractional",
            f"{d}-d fractional max pooling over (N, C, ...) or (C, ...) inputs: windows of kernel_size "
            f"at pseudo-random starts, per (N, C) plane, from random_samples (N, C, {d}) in [0, 1)",
            inputs=("x", "random_samples"), constant_inputs=("random_samples",),
            params=(Param("kernel_size", "ints", None, "window size (int or tuple)", 1, required=True),
                    Param("output_size", "ints", None, "output size (int or tuple); or give "
                          "output_ratio", 1),
                    Param("output_ratio", "ratios", None, "output size as a fraction of the input "
                          "size, in (0, 1): int(in * ratio) (number or tuple)"),
                    _RETURN_INDICES),
            spatial=d, check=_check_fractional(d), torch_name=f"F.fractional_max_pool{d}d"))
    specs.append(OpSpec("maxout", "maxout", "max over groups of `pieces` consecutive channels (dim 1)",
                        params=(Param("pieces", "int", None, "channels per group", 1, required=True),)))
    return specs


# ----------------------------------------------------------------------------- unpool, logsumexp

def _check_unpool(spatial):
    def check(params):
        if params["stride"] is None:
            params["stride"] = params["kernel_size"]
    return check


def _unpool_params(d: int) -> tuple[Param, ...]:
    return (
        Param("kernel_size", "ints", None, "the pooling window size (int or tuple)", 1, required=True),
        Param("stride", "ints", None, "the pooling step (int or tuple; default kernel_size)", 1),
        Param("padding", "ints", (0,) * d, "the pooling padding (int or tuple)", 0),
        Param("output_size", "ints", None, "spatial output size (default: (in - 1) * stride - "
              "2 * padding + kernel_size); the whole (N, C, *spatial) shape also does", 1, leading=2),
    )


# the temperature must stay a nonzero, finite number in float32 (float16 computes in float32)
MIN_TEMPERATURE = 1.1754943508222875e-38  # the smallest normal float32
MAX_TEMPERATURE = 3.4028234663852886e38  # the largest float32


def _check_logsumexp(params):
    t = params["temperature"]
    if not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
        raise ValueError(f"logsumexp: temperature must be a real number > 0, within float32's normal "
                         f"range [{MIN_TEMPERATURE!r}, {MAX_TEMPERATURE!r}], got {t!r}")


UNPOOL_POLICY_WHY = ("a slot written by several elements (duplicate indices) keeps the value of the "
                     "first or last of them in row-major order and sends its gradient to that one, "
                     "or ('all', PyTorch) keeps the last and sends the gradient to each; 'split' "
                     "has no value to write")
UNPOOL_NAN_WHY = "unpooling compares no values: NaN and inf are moved like any other number"


def _unpool_logsumexp_specs() -> list[OpSpec]:
    specs = []
    for d in (1, 2, 3):
        specs.append(OpSpec(
            f"max_unpool{d}d", "unpool",
            f"{d}-d max unpooling: input scattered into zeros at the flat per-plane indices of "
            f"max_pool{d}d(return_indices=True)",
            inputs=("input", "indices"), params=_unpool_params(d), spatial=d,
            check=_check_unpool(d), torch_name=f"F.max_unpool{d}d",
            policies=("first", "last", "all"), nan_rules=("dominate",),
            policies_why=UNPOOL_POLICY_WHY, nan_why=UNPOOL_NAN_WHY))
    specs.append(OpSpec(
        "logsumexp", "logsumexp",
        "temperature * log(sum(exp(x / temperature))) over dim(s), the smooth max",
        params=_RED + (Param("temperature", "float", 1.0, "smoothing temperature t > 0; as t -> 0+ "
                             "the gradient tends to the split policy's W"),),
        check=_check_logsumexp, torch_name="torch.logsumexp",
        policies=("split",), nan_rules=("nan",),
        policies_why="logsumexp is smooth: its gradient softmax(x / t) tends to the split policy's W "
                     "as t -> 0+, which is the policy it names",
        nan_why="as torch.logsumexp: a slice holding NaN outputs NaN and its gradient is NaN"))
    return specs


OPS: dict[str, OpSpec] = {s.name: s for s in _spec_list()}


# ----------------------------------------------------------------------------- issue 30: activations
#
# Hard activations written as a max/min of affine pieces (the W-matrix view), argument order chosen
# so that each op's default policy ('first') gives the value its torch_name gives at the kinks.

def _check_rrelu(params):
    if params["lower"] > params["upper"]:
        raise ValueError(f"rrelu: lower must be <= upper, got lower={params['lower']!r}, "
                         f"upper={params['upper']!r}")
    if not math.isfinite((params["lower"] + params["upper"]) / 2):
        raise ValueError(f"rrelu: the slope (lower + upper)/2 must be finite in float64, got "
                         f"lower={params['lower']!r}, upper={params['upper']!r}")


def _rrelu(params, xs, literal: bool = False):
    # evaluation mode: leaky_relu with the mean slope, as torch.rrelu(training=False) computes it
    return _leaky({"negative_slope": (params["lower"] + params["upper"]) / 2}, xs, literal)


def _check_lambd(name):
    def check(params):
        if params["lambd"] < 0:
            raise ValueError(f"{name}: lambd must be >= 0, got {params['lambd']!r}")
    return check


def _softshrink(params, xs):
    # min(max(0, x - lambd), x + lambd): 0 for |x| <= lambd, x -+ lambd beyond
    (x,) = xs
    lambd = _num(params["lambd"])
    return MinOf(MaxOf(sp.S.Zero, x - lambd), x + lambd)


def _activation_specs() -> list[OpSpec]:
    lambd = Param("lambd", "float", 0.5, "the half width of the zero band (>= 0)")
    return [
        OpSpec("rrelu", "elementwise", "leaky_relu with slope (lower + upper)/2: F.rrelu in "
               "evaluation mode (training=False)",
               params=(Param("lower", "float", 1 / 8, "lower bound of the slope"),
                       Param("upper", "float", 1 / 3, "upper bound of the slope")),
               forward=_rrelu, framework_forward=lambda p, xs: _rrelu(p, xs, literal=True),
               check=_check_rrelu, torch_name="F.rrelu"),
        OpSpec("softshrink", "elementwise", "min(max(0, x - lambd), x + lambd): x - lambd above "
               "lambd, x + lambd below -lambd, 0 between", params=(lambd,), forward=_softshrink,
               check=_check_lambd("softshrink"), torch_name="F.softshrink"),
    ]


OPS.update({s.name: s for s in _activation_specs()})

# ----------------------------------------------------------------------------- segments (issue 33)
# Segment and scatter max/min: windows given by an index (kinds/segment.py).  scatter_max/min take
# torch.Tensor.scatter_reduce's arguments (input, dim, index, src, include_self; reduce "amax"/
# "amin" by the op's name); segment_max/min take jax.ops.segment_max's (data, segment_ids,
# num_segments, indices_are_sorted).

def _segment_specs() -> list[OpSpec]:
    specs = []
    for ext, torch_reduce in (("max", "amax"), ("min", "amin")):
        specs.append(OpSpec(
            f"scatter_{ext}", "segment",
            f"input.scatter_reduce(dim, index, src, '{torch_reduce}', include_self): output j (along "
            f"dim) is the {ext} of the src elements whose index is j, after input[j] where "
            f"include_self; a j no index names keeps input[j]",
            inputs=("input", "index", "src"), constant_inputs=("index",), extremum=ext,
            params=(Param("dim", "int", 0, "the axis that index scatters along (negative: from "
                          "the end)", -64),
                    Param("include_self", "bool", True, "input[j] takes part in segment j "
                          "(PyTorch's include_self)")),
            torch_name="torch.Tensor.scatter_reduce"))
        specs.append(OpSpec(
            f"segment_{ext}", "segment",
            f"jax.ops.segment_{ext}: output j (along dim 0) is the {ext} of the data rows whose "
            f"segment id is j; an empty segment is {'-inf' if ext == 'max' else '+inf'}",
            inputs=("data", "segment_ids"), constant_inputs=("segment_ids",), extremum=ext,
            params=(Param("num_segments", "int", None, "number of segments (default: "
                          "max(segment_ids) + 1)", 0),
                    Param("indices_are_sorted", "bool", False, "segment_ids are sorted (a "
                          "ValueError where they are not; the sort is skipped)")),
            torch_name=""))
    return specs


OPS.update({s.name: s for s in _segment_specs()})

# CSR segments (issue 33): torch_scatter's segment_max_csr/segment_min_csr(src, indptr): output j
# (along dim 0) is the max/min of src[indptr[j]:indptr[j + 1]] (the lowering is segment_max's).
OPS.update({f"segment_{ext}_csr": OpSpec(
    f"segment_{ext}_csr", "segment",
    f"torch_scatter.segment_{ext}_csr(src, indptr): output j (along dim 0) is the {ext} of the src "
    f"rows indptr[j] to indptr[j + 1] - 1 (indptr ascending from 0 to src.shape[0]); an empty "
    f"segment is {'-inf' if ext == 'max' else '+inf'} (torch_scatter: 0, its pyg preset)",
    inputs=("src", "indptr"), constant_inputs=("indptr",), extremum=ext, torch_name="")
    for ext in ("max", "min")})

# ----------------------------------------------------------------------------- order statistics

ORDER_NAN_WHY = ("NaN ranks as the largest value, as PyTorch and JAX sort and select (NaNs tie with "
                 "each other)")
CUMULATIVE_NAN_WHY = ("a prefix holding NaN has output NaN and its gradient goes to the NaN(s) by "
                      "the tie policy ('dominate'), or ('zero', split/all) no gradient")
_ORDER_DIM = Param("dim", "int", -1, "the dim to rank along (negative: from the end)", -MAX_INT)


def _order_specs() -> list[OpSpec]:
    """sort, topk, cummax, cummin (kinds/order.py): each output the element of one rank."""
    cumulative = (Param("dim", "int", None, "the dim to scan along (negative: from the end)", -MAX_INT,
                        required=True),)
    return [
        OpSpec("sort", "ranking", "the row along dim sorted (values, and the permutation as int64 "
               "indices)", params=(_ORDER_DIM, Param("descending", "bool", False, "largest first"),
                                   Param("stable", "bool", False, "PyTorch's flag: the tie policy "
                                         "decides the order of equal elements (first: stable)")),
               torch_name="torch.sort", nan_rules=("largest",), nan_why=ORDER_NAN_WHY),
        OpSpec("topk", "ranking", "the k largest (or smallest) elements of the row along dim, in rank "
               "order (values, and their int64 indices)",
               params=(Param("k", "int", None, "how many", 0, required=True), _ORDER_DIM,
                       Param("largest", "bool", True, "the largest (else the smallest)"),
                       Param("sorted", "bool", True, "PyTorch's flag: the output is in rank order "
                             "either way")),
               torch_name="torch.topk", nan_rules=("largest",), nan_why=ORDER_NAN_WHY),
        OpSpec("cummax", "ranking", "output i = max(x[0..i]) along dim (values, and the int64 index "
               "of the element holding it)", params=cumulative, torch_name="torch.cummax",
               nan_rules=("dominate", "zero"), nan_why=CUMULATIVE_NAN_WHY),
        OpSpec("cummin", "ranking", "output i = min(x[0..i]) along dim (values, and the int64 index "
               "of the element holding it)", params=cumulative, extremum="min",
               torch_name="torch.cummin", nan_rules=("dominate", "zero"), nan_why=CUMULATIVE_NAN_WHY),
    ]


OPS.update({s.name: s for s in _order_specs()})


# ----------------------------------------------------------------------------- one rank: kthvalue, median

_KEEPDIM = Param("keepdim", "bool", False, "keep the reduced dim(s) with size 1")
_MEDIAN_DIM = Param("dim", "int", None, "the dim to take the median along (negative: from the end; "
                    "none: every element, and the output is the value only)", -MAX_INT)
MEDIAN_NAN_WHY = ("a row holding NaN has output NaN: its gradient goes to the NaN(s) by the tie "
                  "policy ('dominate', PyTorch) or nowhere ('propagate', JAX)")
NANMEDIAN_NAN_WHY = ("NaNs are left out; a row of NaNs only has output NaN, its gradient to its NaNs "
                     "by the tie policy ('omit', PyTorch) or nowhere ('omit_zero', JAX)")


def _median_specs() -> list[OpSpec]:
    """kthvalue, median, nanmedian (kinds/median.py): one output per row, the element of one rank
    of the ascending order (a median of an even count: the lower middle; JAX's preset averages
    the two middle elements)."""
    middle = (_MEDIAN_DIM, _KEEPDIM)
    return [
        OpSpec("kthvalue", "ranking", "the k-th smallest element of the row along dim (values, and "
               "its int64 index)", params=(Param("k", "int", None, "which rank (1: the smallest)", 1,
                                                 required=True), _ORDER_DIM, _KEEPDIM),
               extremum="min", torch_name="torch.kthvalue", nan_rules=("largest",), nan_why=ORDER_NAN_WHY),
        OpSpec("median", "ranking", "the middle element of the row along dim, the lower of two for an "
               "even count (values, and with dim its int64 index)", params=middle, extremum="min",
               torch_name="torch.median", nan_rules=("dominate", "propagate"), nan_why=MEDIAN_NAN_WHY),
        OpSpec("nanmedian", "ranking", "the median of the row's numbers along dim, NaNs left out "
               "(values, and with dim its int64 index)", params=middle, extremum="min",
               torch_name="torch.nanmedian", nan_rules=("omit", "omit_zero"), nan_why=NANMEDIAN_NAN_WHY),
    ]


OPS.update({s.name: s for s in _median_specs()})

# ----------------------------------------------------------------------------- issue 30: losses
# The margin losses that are elementwise before their reduction, in the W-matrix view (PyTorch's
# reduction='none'; losses.py adds PyTorch's reduction='sum'/'mean' around the module).

def _l1_loss(params, xs):
    # |input - target| = max(d, -d), d = input - target, as torch.abs of the difference
    d = xs[0] - xs[1]
    return MaxOf(d, -d)


def _margin_ranking_loss(params, xs):
    # max(0, margin - target * (input1 - input2)), as PyTorch's clamp_min(-target * (x1 - x2) + margin, 0)
    input1, input2, target = xs
    return MaxOf(sp.S.Zero, _num(params["margin"]) - target * (input1 - input2))


def _loss_specs() -> list[OpSpec]:
    return [
        OpSpec("l1_loss", "elementwise", "|input - target| = max(input - target, target - input) "
               "(F.l1_loss with reduction='none')", inputs=("input", "target"), forward=_l1_loss,
               torch_name="F.l1_loss"),
        OpSpec("margin_ranking_loss", "elementwise", "max(0, margin - target * (input1 - input2)) "
               "(F.margin_ranking_loss with reduction='none')", inputs=("input1", "input2", "target"),
               params=(Param("margin", "float", 0.0, "the margin"),), forward=_margin_ranking_loss, torch_name="F.margin_ranking_loss"),
    ]


OPS.update({s.name: s for s in _loss_specs()})

# ----------------------------------------------------------------------------- NaN-aware reductions
# nanmax/nanmin (issue 30): np.nanmax/jnp.nanmax; PyTorch has none (conventions.py: what its
# preset reads as the PyTorch user's code). symgrad/nanreduce.py lowers the rule 'fill'.
NANRED_NAN_WHY = ("nanmax/nanmin skip NaN: 'skip' leaves the NaNs out, 'fill' reads them as -inf "
                  "(+inf for nanmin) with no gradient, as where(isnan(x), -inf, x) reduced")
OPS.update({s.name: s for s in (
    OpSpec("nanmax", "reduction", "max over dim(s) ignoring NaN (np.nanmax: NaN only where a slice "
           "holds nothing else)", params=_RED, torch_name="", nan_rules=("skip", "fill"),
           nan_why=NANRED_NAN_WHY),
    OpSpec("nanmin", "reduction", "min over dim(s) ignoring NaN (np.nanmin: NaN only where a slice "
           "holds nothing else)", params=_RED, extremum="min", torch_name="", nan_rules=("skip", "fill"),
           nan_why=NANRED_NAN_WHY))})

# ----------------------------------------------------------------------------- issue 30: hard activations

def _float32(v: float) -> float:
    """v rounded to float32 (PyTorch's kernels hold some constants as floats, in every dtype)."""
    import struct
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _hardsigmoid(params, xs, convention=None):
    # (min(max(x, -3), 3) + 3) / 6: as F.hardsigmoid's min(max(x + 3, 0), 6) / 6 for every float
    # (x + 3 is the same rounding where -3 <= x <= 3, and the clamp takes over outside), compared
    # through x as PyTorch's backward does (-3 < x < 3), the bounds first ('first': 0 at both)
    from .scaled import Scaled
    (x,) = xs
    if convention == "jax":  # relu6(x + 3) / 6: compared through x + 3, XLA's / 6 is * (1/6)
        return Scaled(MinOf(6, MaxOf(0, x + 3)), 0, 6, sp.Rational(1, 6), False)
    # PyTorch's backward multiplies by 1/6 held as a float (in float64 too)
    scale = Literal("one_sixth", _float32(1 / 6)) if convention == "torch" else sp.Rational(1, 6)
    return Scaled(MinOf(3, MaxOf(-3, x)), 3, 6, scale, True)


def _hard_specs() -> list[OpSpec]:
    return [
        OpSpec("hardsigmoid", "elementwise", "(min(max(x, -3), 3) + 3) / 6: 0 below -3, 1 above 3",
               forward=_hardsigmoid, torch_name="F.hardsigmoid",
               framework_forward=lambda p, xs: {c: _hardsigmoid(p, xs, c) for c in ("torch", "jax")}),
    ]


OPS.update({s.name: s for s in _hard_specs()})


def _threshold(params, xs):
    # x where x beats the threshold, else value: W of max(threshold, x) times (value, x); the
    # threshold first ('first': value at x = threshold, as F.threshold's x <= threshold)
    from .scaled import Picked
    (x,) = xs
    return Picked(MaxOf(_num(params["threshold"]), x), _num(params["value"]), x)


THRESHOLD_POLICY_WHY = ("the output jumps from value to x where x passes the threshold: at the tie "
                        "it is value (first) or x (last); 'split' and 'all' would output their mean "
                        "or their sum, a value the function takes on neither side")
OPS.update({s.name: s for s in [
    OpSpec("threshold", "elementwise", "x where x > threshold, else value (W of max(threshold, x) "
           "times (value, x))",
           params=(Param("threshold", "float", None, "the value x must exceed", required=True),
                   Param("value", "float", None, "the output where x does not exceed it", required=True)),
           forward=_threshold, torch_name="F.threshold", policies=("first", "last"),
           policies_why=THRESHOLD_POLICY_WHY),
]})

# ----------------------------------------------------------------------------- issue 30: hardshrink

def _hardshrink(params, xs):
    # x where |x| > lambd, else 0: W of max(lambd, x, -x) times (0, x, x) (threshold's Picked, |x| as
    # the two pieces x and -x); lambd first ('first': 0 at both kinks, as F.hardshrink's band
    # -lambd <= x <= lambd), and a NaN in x and -x picks x itself
    from .scaled import Picked
    (x,) = xs
    return Picked(MaxOf(_num(params["lambd"]), x, -x), sp.S.Zero, x, x)


OPS.update({s.name: s for s in [
    OpSpec("hardshrink", "elementwise", "x where |x| > lambd, else 0 (W of max(lambd, x, -x) "
           "times (0, x, x))", params=(Param("lambd", "float", 0.5, "the half width of the zero "
                                             "band (< 0: none, as F.hardshrink)"),),
           forward=_hardshrink, torch_name="F.hardshrink",
           policies=("first", "last"), policies_why=THRESHOLD_POLICY_WHY.replace(
               "from value to x where x passes the threshold", "from 0 to x where |x| passes lambd").replace(
               "it is value (first)", "it is 0 (first)")),
]})

# ----------------------------------------------------------------------------- issue 30: hardswish

def _hardswish(params, xs, convention=None):
    # x * (min(3, max(-3, x)) + 3) / 6 (x * min(max(x + 3, 0), 6) / 6: the same rounding, as
    # hardsigmoid), written per region of its node (regions.Regions): PyTorch's backward
    # x <= -3 ? 0 : x < 3 ? g * (x / 3 + 0.5) : g, the bounds first ('first': 0 at -3, g at 3; under
    # 'keep' a NaN x loses the outer min to 3: g, as its scalar path)
    from .lower import Product, Quotient
    from .regions import G, NODE, Regions
    (x,) = xs
    if convention == "jax":  # x * hard_sigmoid(x), hard_sigmoid = relu6(x + 3) * (1/6) (XLA's / 6):
        # autodiff gives g * hs + [0 < x + 3 < 6] * ((x * g) * (1/6)), compared through x + 3
        sixth = sp.Rational(1, 6)
        return Regions(MinOf(6, MaxOf(0, x + 3)), Product(x, Product(NODE, sixth)),
                       sp.Tuple(0, sp.Tuple(0, Product(Product(x, G), sixth))), Product(G, Product(NODE, sixth)))
    return Regions(MinOf(3, MaxOf(-3, x)), Quotient(x * (NODE + 3), 6),
                   sp.Tuple(G, sp.Tuple(0, G * (Quotient(x, 3) + sp.Rational(1, 2)))), 0)


OPS.update({s.name: s for s in [
    OpSpec("hardswish", "elementwise", "x * (min(max(x, -3), 3) + 3) / 6: 0 below -3, x above 3",
           forward=_hardswish, torch_name="F.hardswish",
           framework_forward=lambda p, xs: {c: _hardswish(p, xs, c) for c in ("torch", "jax")}),
]})

# ----------------------------------------------------------------------------- issue 30: elu, celu

def _check_celu_alpha(params):
    if params["alpha"] == 0:  # celu divides by alpha
        raise ValueError(f"celu: alpha must be non-zero, got {params['alpha']!r}")


def _elu(params, xs, convention=None, celu=False):
    # W of max(0, x) times (alpha * expm1(x / s), x), s = alpha for celu, else 1: 0 first
    # ('first': the exp piece at 0, as aten's x <= 0), each region's value and gradient as the
    # framework computes them (regions.Regions); a NaN takes max(0, x) under 'dominate': x and g
    from sympy.codegen.cfunctions import expm1

    from .lower import Product, Quotient
    from .regions import G, Regions
    (x,) = xs
    alpha = _num(params["alpha"])
    if convention == "jax":  # where(x > 0, x, alpha * expm1(where(x > 0, 0, x))): expm1's jvp
        # is g * (ans + 1); celu: expm1(x / alpha)
        inner = Quotient(x, alpha) if celu else x
        e = expm1(inner)
        back = Product(Product(alpha, G), e + 1)
        back = Quotient(back, alpha) if celu else back
        return Regions(MaxOf(0, x), sp.Tuple(Product(alpha, e), x), sp.Tuple(back, G), 0)
    # aten's elu kernel: expm1(x * input_scale) * alpha; backward g * input_scale * alpha *
    # exp(x * input_scale), input_scale 1 (elu) or 1/alpha held in the dtype (celu)
    scale = Literal("input_scale", 1 / params["alpha"]) if celu else None
    arg = Product(x, scale) if celu else x
    g = Product(G, scale) if celu else G
    return Regions(MaxOf(0, x), sp.Tuple(Product(alpha, expm1(arg)), x),
                   sp.Tuple(Product(Product(g, alpha), sp.exp(arg)), G), 0)


_ALPHA = Param("alpha", "float", 1.0, "the negative saturation value")
OPS.update({s.name: s for s in [
    OpSpec("elu", "elementwise", "x where x > 0, else alpha * (exp(x) - 1) (W of max(0, x) times "
           "(alpha * (exp(x) - 1), x))", params=(_ALPHA,), forward=_elu, torch_name="F.elu",
           framework_forward=lambda p, xs: {c: _elu(p, xs, c) for c in ("torch", "jax")}),
    OpSpec("celu", "elementwise", "x where x > 0, else alpha * (exp(x / alpha) - 1) (W of max(0, x) "
           "times (alpha * (exp(x / alpha) - 1), x))", params=(_ALPHA,), check=_check_celu_alpha,
           forward=lambda p, xs: _elu(p, xs, None, True), torch_name="F.celu",
           framework_forward=lambda p, xs: {c: _elu(p, xs, c, True) for c in ("torch", "jax")}),
]})
# ----------------------------------------------------------------------------- bags (issue 33)
# embedding_bag_max: F.embedding_bag(input, weight, offsets, mode="max", include_last_offset,
# padding_idx) (kinds/bag.py); the gradient goes to weight only.
OPS["embedding_bag_max"] = OpSpec(
    "embedding_bag_max", "bag",
    "F.embedding_bag(input, weight, offsets, mode='max'): output[b, f] is the max of "
    "weight[input[i], f] over bag b's indices i (offsets, or the rows of a 2-d input), padding_idx "
    "left out; an empty bag is 0",
    inputs=("input", "weight", "offsets"), constant_inputs=("input", "offsets"),
    params=(Param("include_last_offset", "bool", False, "offsets has one more entry, the end of "
                  "the last bag (PyTorch's include_last_offset)"),
            Param("padding_idx", "int", None, "a table row left out of every bag (negative: from "
                  "the end of weight's rows; default none)", -MAX_INT)),
    torch_name="F.embedding_bag")
# roi_max_pool: torchvision.ops.roi_pool(input, boxes, output_size, spatial_scale) (kinds/roi.py)
OPS["roi_max_pool"] = OpSpec(
    "roi_max_pool", "roi",
    "torchvision.ops.roi_pool(input, boxes, output_size, spatial_scale): output[k, c, ph, pw] is "
    "the max of input[batch index, c] over bin (ph, pw) of box k (quantized; bins may overlap); an "
    "empty bin is 0",
    inputs=("input", "boxes"), constant_inputs=("boxes",), spatial=2,
    params=(Param("output_size", "ints", None, "bins per box (PH, PW) (int or pair)", 1, required=True),
            Param("spatial_scale", "float", 1.0, "scales the boxes' coordinates to the input's")),
    torch_name="torchvision.ops.roi_pool")
