"""Op kinds: one ``Kind`` object per kind of op, registered once in ``KINDS``.

An ``OpSpec`` names its kind (``spec.kind``); what differs from one kind to another is here, as
data and small functions, and the spine modules ask this registry instead of testing kind names:

* how it derives and lowers: ``elementwise`` (a max/min of pieces of the named inputs, derive.py,
  an ElementwiseKernel), a window's extremum (derive.py, a WindowKernel of the kind's geometry),
  ``special`` (no max/min of pieces: derive_special.py, lower.lower_special, docs_special.py) or
  ``expression`` (expr.py);
* its window: ``window_size(params)``, whether it is ``static`` (known when the code is generated,
  bounded by ops.MAX_WINDOW through ``window_param``), the checks a representative window adds;
* which settings it refuses (``settings``) and whether a preset decides how padding takes part;
* how the CLI and the generated docstrings describe its windows and its backward.

Adding an op kind: a ``Kind`` here, its specs in ops.py (and catalog.toml), its templates.
Param kinds (ints, float, ...) and derivation node kinds (max, min, smooth) are not op kinds.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from . import policy as _policy

# ops.py imports this module: the functions below take an ops.Op (named "Op" in their annotations)

# the window a reduction, adaptive window or logsumexp is derived on: its length is known only at
# run time, and the rule derived on it is the same for every length
REPRESENTATIVE_REDUCTION_WINDOW = 4
FRACTIONAL_WINDOWS = (
    "per (N, C) plane and axis, window i starts at int((i + u) * alpha) - int(u * alpha), alpha = "
    "(in - k) / (out - 1), computed in the input's dtype from that plane's sample u, the last at "
    "in - k (PyTorch's sequence); windows may overlap")


def _none(*_) -> list[str]:
    return []


@dataclass(frozen=True)
class Kind:
    name: str
    elementwise: bool = False  # forward: the spec's own max/min of pieces; the argument order applies
    special: bool = False  # not a max/min of pieces (unpool, logsumexp)
    expression: bool = False  # a user's expression (expr.py)
    # forward scatters the input into the slots an integer input `indices` names (unpooling): the
    # writers of a slot tie by their indices, not their values
    scatter: bool = False
    window_size: Callable[[dict], int] | None = None  # the window derived on, from the parameters
    static: bool = False  # one window of window_param elements, known when the code is generated
    window_param: str = ""  # the parameter that sizes a static window (bounded by ops.MAX_WINDOW)
    preset_padding: bool = False  # a framework preset decides whether padding takes part
    # refuses settings the kind does not define: settings(op name, ties, nan)
    settings: Callable[[str, str, str], None] = _none
    # `symgrad derive`: lines on the windows (op, the largest window listed in full), on backward
    describe: Callable[["Op", int], list[str]] = _none
    backward: Callable[["Op"], list[str]] = _none
    # the module docstring's paragraph on the windows (after the forward's summary)
    windows_doc: str = ""
    # the check a derivation on a representative window adds (format field n: its size)
    representative_note: str = ""
    windows_vary: bool = False  # windows differ in size (the docs' W says so)
    # the op whose rows of the conventions table (table.SITUATIONS) stand for this kind's ops
    conventions_family: str = ""

    def window(self, op: "Op") -> int:
        if self.window_size is None:
            raise ValueError(f"{op.name} has no window")
        return self.window_size(op.params)


# ----------------------------------------------------------------------------- settings

def _elementwise_settings(name: str, ties: str, nan: str) -> None:
    if nan == "each" and name not in ("maximum", "minimum"):
        raise ValueError(f"{name}: NaN rule 'each' is defined for a single max/min (maximum, "
                         f"minimum, windows), not for {name}")


def _reduction_settings(name: str, ties: str, nan: str) -> None:
    if ties in ("first", "last") and nan != "dominate":
        raise ValueError(f"{name}: with ties={ties!r} a reduction follows NaN rule 'dominate' "
                         f"(NumPy's argmax/argmin), not {nan!r}")


# ----------------------------------------------------------------------------- descriptions

def _describe_static(op: "Op", listed: int) -> list[str]:
    offs = [f"x{i}={o}" for i, o in enumerate(itertools.product(*map(range, op.params["kernel_size"])))]
    if len(offs) > listed:  # derived on a representative window: first and last
        offs = offs[:2] + ["..."] + offs[-1:]
    return [f"window elements (row-major scan order): {', '.join(offs)}"]


def _describe_fractional(op: "Op", listed: int) -> list[str]:
    return _describe_static(op, listed) + [f"windows: {FRACTIONAL_WINDOWS}"]


def _describe_reduction(op: "Op", listed: int) -> list[str]:
    return [f"window: a representative slice of {op.window_size()} elements "
            f"(the rule is the same for every length)"]


def _describe_adaptive(op: "Op", listed: int) -> list[str]:
    return [f"windows: PyTorch's adaptive windows, [floor(i*L/out), ceil((i+1)*L/out)) per "
            f"axis, overlapping and of varying size; derived on a representative window "
            f"of {op.window_size()} elements (the rule is the same for every size)"]


def _window_backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_x[i] = sum over the windows w holding i of w_k(i) * grad_output[w]"
            "  (W^T g; overlapping windows accumulate)"
            + ("; random_samples: None" if op.spec.constant_inputs else "")]


def _unpool_backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_input = W^T grad_output, a gather: grad_input[i] = grad_output.flat[indices[i]]"
            " per plane" + ("" if _policy.TIES[op.ties].winners == "each" else " for the element that stayed in its slot, 0 "
                                                        "for the others") + "; indices: None"]


def _logsumexp_backward(op: "Op") -> list[str]:
    return ["", "== backward ==", "  grad_x = grad_output * exp((x - y) / t) = grad_output * "
            "softmax(x / t); as t -> 0+ the split policy's W"]


# ----------------------------------------------------------------------------- the kinds

def _kernel_window(params: dict) -> int:
    return math.prod(params["kernel_size"])


def _representative(params: dict) -> int:
    return REPRESENTATIVE_REDUCTION_WINDOW


_WINDOW = dict(backward=_window_backward)

ELEMENTWISE = Kind("elementwise", elementwise=True, settings=_elementwise_settings)
EXPRESSION = Kind("expression", expression=True)
POOL = Kind("pool", window_size=_kernel_window, static=True, window_param="kernel_size",
            preset_padding=True, describe=_describe_static, conventions_family="max_pool1d",
            **_WINDOW)
MAXOUT = Kind("maxout", window_size=lambda params: params["pieces"], static=True,
              window_param="pieces", **_WINDOW)
# fractional pooling's presets are adaptive pooling's (torch: first, last NaN; jax: split, nan)
FRACTIONAL = Kind("fractional", window_size=_kernel_window, static=True, window_param="kernel_size",
                  describe=_describe_fractional, windows_doc=f"Windows: {FRACTIONAL_WINDOWS}.",
                  conventions_family="adaptive_max_pool1d", **_WINDOW)
REDUCTION = Kind("reduction", window_size=_representative, settings=_reduction_settings,
                 describe=_describe_reduction, **_WINDOW)
ADAPTIVE = Kind(
    "adaptive", window_size=_representative, describe=_describe_adaptive,
    windows_doc="Windows: along an axis of length L with out outputs, window i covers [floor(i*L/out), "
                "ceil((i+1)*L/out)), as PyTorch's; L is known only at run time, so the rule below is "
                "derived on a representative window and holds for every window size.",
    representative_note=(
        "adaptive windows (start floor(i*L/out), end ceil((i+1)*L/out) per axis) overlap and "
        "differ in size, and depend on the input length known only at run time: the rule is "
        "derived on a representative window of {n} elements, whose weights "
        "have one factor per other element at any length, and is lowered to a running scan "
        "(first/last) or a mask of the elements attaining the extremum (split/all), valid for "
        "every window length"),
    conventions_family="adaptive_max_pool1d", windows_vary=True, **_WINDOW)
# each output element receives at most the elements written to it
UNPOOL = Kind("unpool", special=True, scatter=True, window_size=lambda params: 1, backward=_unpool_backward)
LOGSUMEXP = Kind("logsumexp", special=True, window_size=_representative, backward=_logsumexp_backward)

KINDS: dict[str, Kind] = {k.name: k for k in (ELEMENTWISE, EXPRESSION, POOL, MAXOUT, FRACTIONAL,
                                              REDUCTION, ADAPTIVE, UNPOOL, LOGSUMEXP)}
