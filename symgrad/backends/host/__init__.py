"""The host layer: the Python side that every backend emits (the NumPy backend's module itself, the
cpu backend's ctypes loader, the CUDA backend's CuPy loader).  ``printer.py`` is the host language's
printer (NumPy); ``templates/`` holds the Python pieces the backends' templates include as
``host/<file>`` (argument checks, Saved, layouts, bfloat16 views, geometry); this module the context
those pieces need, for every backend: the bfloat16 wrappers' names, which functions compute
bfloat16 in bfloat16, the partials chosen from the lowered kernel, shared docstring phrases."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import sympy as sp

from ...geometry import ADAPTIVE
from ...lower import ElementwiseKernel, LogSumExpKernel, UnpoolKernel, backward_plan
from ..common import special_docstring, wrap
from ..printing import PYTHON, integer_code
from .printer import numpy_integer_code

if TYPE_CHECKING:  # annotations only: the lowering makes the Artifacts a backend reads
    from ...lower import Artifacts


# how the host code writes an array parameter, its shape in an error message and a Saved field's
# type, for the arrays it takes: NumPy's (the NumPy module, the cpu loader) and CuPy's (the CUDA loader)
NUMPY_ARRAYS = {"x_parameter": "x: np.ndarray", "x_shape_shown": "{x.shape}", "array_type": "np.ndarray"}
CUPY_ARRAYS = {"x_parameter": "x", "x_shape_shown": "{tuple(x.shape)}", "array_type": "object"}


def preamble_context(header_lines: list[str], note: list[str] | None, imports: tuple[str, ...]) -> dict:
    """What _preamble.py.jinja (every module's and loader's start) places besides the op's names:
    the provenance header's lines, the lines after the docstring's (a loader's note after a blank
    line; None: none, the NumPy module) and the standard-library imports, as lines."""
    return {"header_py": list(header_lines), "note_lines": [] if note is None else ["", *note],
            "import_lines": list(imports)}


def bfloat16_context(art: Artifacts) -> dict:
    """The inputs' names for the bfloat16 wrappers (_bfloat16.py.jinja), and those whose dtype is
    the output's (not unpooling's integer indices, not constant inputs such as random samples)."""
    op = art.op
    names = list(art.kernel.inputs if op.spec.strategy.expression else op.spec.inputs)
    integer = ("indices",) if op.spec.strategy.scatter else ()  # unpooling's integer indices
    return {"input_names": names, "dtype_inputs": repr(tuple(
        n for n in names if n not in op.spec.constant_inputs and n not in integer)),
            # the functions computing a whole-bfloat16 op in bfloat16 (None: its float32 ones), and
            # the lines saying so (an elementwise NumPy module under a preset: _elementwise_bfloat16)
            "bfloat16_kernels": _lse_bfloat16(art), "bfloat16_note": [],
            # a broadcast input's gradient summed in XLA's order (conventions.BROADCAST_SUMS "jax")
            "xla_sum_to": getattr(art.kernel, "broadcast_sum", "numpy") == "jax",
            # a whole-bfloat16 call returns the second of two equal operands (Preset.bfloat16_zeros)
            "bfloat16_second": op.bfloat16_zeros == "second" and len(names) == 2}


def _lse_bfloat16(art: Artifacts) -> dict | None:
    """logsumexp's functions computing a whole-bfloat16 op in bfloat16 where its kernel's half names
    a framework (host/_lse_half.py.jinja, in the NumPy module and the cpu loader alike), else None."""
    kernel = art.kernel
    return dict(LSE_BFLOAT16) if isinstance(kernel, LogSumExpKernel) and kernel.half != "float32" else None


def lse_half_partial(kernel) -> str:
    """The host partial defining a logsumexp module's _half_forward, _half_backward and _half_jvp (its
    kernel's half names the framework whose ops it rounds as they round)."""
    return f"host/_lse_half_{kernel.half}.py.jinja"


def computes_bfloat16(art: Artifacts) -> bool:
    """Whether the NumPy module computes a whole-bfloat16 op in bfloat16 (_elementwise_bfloat16:
    an elementwise op under a preset whose half is "half"), not as its float32 code rounded once."""
    return bool(bfloat16_kernels(art))


# the NumPy module's functions computing a whole-bfloat16 op in bfloat16, by site: an elementwise op's
# own (its numbers, products, sums and quotients each rounded to bfloat16), or max pooling's
# backward adding in bfloat16 (WindowKernel.bfloat16_adds; forward and jvp the float32 ones,
# "_float_", rounded once)
ELEMENTWISE_BFLOAT16 = {"forward": "_forward_bf16", "backward": "_backward_bf16", "jvp": "_jvp_bf16"}
BFLOAT16_ADDS = {"forward": "_float_forward", "backward": "_backward_bf16", "jvp": "_float_jvp"}
# logsumexp's ops each rounded to bfloat16 (LogSumExpKernel.half "torch", "jax"; jvp its float32 code)
LSE_BFLOAT16 = {"forward": "_forward_bf16", "backward": "_backward_bf16", "jvp": "_jvp_bf16"}


def bfloat16_kernels(art: Artifacts) -> dict | None:
    """The functions of an op's NumPy module that compute a whole-bfloat16 op in bfloat16 ({site:
    function name}), or None where every bfloat16 call is its float32 code rounded once: an
    elementwise op under a preset whose half is "half" (op.convention, not op.half_in_float) where
    computing in bfloat16 can round apart from that (rounds_apart), a window op whose lowered
    kernel adds bfloat16 gradients in bfloat16.  The NumPy backend builds these functions; the
    compiled backends refuse those calls."""
    op, kernel = art.op, art.kernel
    if op.spec.strategy.expression or op.spec.strategy.special:
        return None
    if isinstance(kernel, ElementwiseKernel):
        if not op.convention or op.half_in_float:
            return None
        back_inter, shared, grads = backward_plan(kernel, kernel.inputs)
        forward_apart = rounds_apart([(a.name, a.expr) for a in kernel.intermediates], [kernel.output])
        backward_apart = rounds_apart([(a.name, a.expr) for a in [*back_inter, *shared, *grads]], [])
        return dict(ELEMENTWISE_BFLOAT16) if forward_apart or backward_apart else None
    return dict(BFLOAT16_ADDS) if kernel.bfloat16_adds == "bfloat16" else None


def rounds_apart(assigns: list, outputs: list) -> bool:
    """Whether computing in bfloat16 (each number rounded to bfloat16, each product, sum and
    quotient rounded) can differ from the float32 code rounded once: a number bfloat16 cannot hold,
    or a rounded operation inside another one (directly or through a temporary).  Not counted as
    rounded, being exact: a negation, and the small weights (a multiple of 1/4 up to 4 in size:
    such numbers, 1 / a count of at most two conditions or / a product of two such counts, their
    selects and sums; inf where 1 / 0 is selected away).  assigns: [(name, expr)] in order."""
    from ...indicators import Literal
    from ...lower import Count, Product, Quotient, Select
    from .printer import bfloat16_value

    counts, smalls, rounded = set(), set(), set()  # temporaries: counts, small weights, rounded

    def is_count(e) -> bool:
        return (isinstance(e, Count) and len(e.args) <= 2) or (isinstance(e, sp.Symbol) and e.name in counts)

    def small(e) -> bool:  # a weight that every dtype holds exactly
        if isinstance(e, sp.Symbol):
            return e.name in smalls
        if e.is_Number:
            return abs(e) <= 4 and (4 * e).is_integer
        if isinstance(e, Quotient):
            den = e.args[1].args if isinstance(e.args[1], sp.Mul) else (e.args[1],)
            return e.args[0] in (1, -1) and len(den) <= 2 and all(is_count(d) for d in den)
        if isinstance(e, Select):
            return small(e.args[1]) and small(e.args[2])
        if isinstance(e, sp.Add):
            return len(e.args) <= 2 and all(small(a) for a in e.args)
        return False

    def rounds(e) -> bool:  # whether e's value comes out of a rounded operation
        if isinstance(e, sp.Symbol):
            return e.name in rounded
        if small(e):
            return False
        if isinstance(e, sp.Mul) and len(e.args) == 2 and -1 in e.args:
            return rounds(e.args[1] if e.args[0] == -1 else e.args[0])
        if isinstance(e, (sp.Mul, sp.Add, Quotient, Product)):
            return True
        return any(rounds(a) for a in e.args)

    def nested(e) -> bool:  # a rounded operation with a rounded operand
        if isinstance(e, (sp.Mul, sp.Add, Quotient, Product)) and rounds(e) and any(rounds(a) for a in e.args):
            return True
        return any(nested(a) for a in e.args)

    for name, e in [*assigns, *((None, e) for e in outputs)]:
        numbers = [float(n) for n in e.atoms(sp.Number)] + [lit.value for lit in e.atoms(Literal)]
        if any(bfloat16_value(v) != v for v in numbers if v == v) or nested(e):
            return True
        if name is not None:
            (counts if is_count(e) else smalls if small(e) else rounded if rounds(e) else set()).add(name)
    return False


def host_partials(kernel) -> dict:
    """The parts of the NumPy templates chosen from the lowered kernel that are imported by name
    (the cpu backend's loaders include NumPy's parts too, so they take the same names): the hit
    counting of the mask form, where the weight shares the gradient; unpooling's writers, every
    writer of a slot getting its gradient or the one that stayed (its wins saved)."""
    if isinstance(kernel, UnpoolKernel):
        return {"writers_partial": f"host/_unpool_{'each' if kernel.each_writer else 'one'}.py.jinja",
                # placed before _check_state's range check of the indices (the cpu loader's: its
                # kernels check the range)
                "indices_range_guard": ""}
    return {"count_partial": "host/_count.py.jinja" if kernel.selection.counts else "host/_no_count.py.jinja"}


def framework_unpool_context(art, backend: str, reduce: dict) -> dict:
    """The torch and jax unpooling modules' context (unpool.py.jinja), finished strings only:
    the writer that stays in a slot is its position reduced over the slot's writers (reduce:
    keep -> the framework's integer min or max) from a start no position reaches (first: the
    smallest, from n; last: the largest, from -1); the writers' parts from the backend's
    _unpool_each/_unpool_one partial."""
    op, kernel = art.op, art.kernel
    return {"docstring": special_docstring(op, art.derivation, kernel), "op": op.name, "ties": op.ties,
            "params": repr(op.params), "piecewise_linear": art.piecewise_linear,
            "spatial": kernel.spatial, "keep": kernel.keep, "each_writer": repr(kernel.each_writer),
            "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            # every writer of a slot gets its gradient, or the one that stayed (its wins saved)
            "writers_partial": f"{backend}/_unpool_{'each' if kernel.each_writer else 'one'}.py.jinja",
            "stay_reduce": reduce[kernel.keep], "stay_start": {"first": "n", "last": "-1"}[kernel.keep],
            "wins_doc": "None: every writer of a slot gets its gradient" if kernel.each_writer else
            "which element stayed in its slot, bool (planes, n)"}


# jvp's docstring phrase under conventions.TANGENT_SUMS "torch" (a reduction's mask form)
TORCH_TANGENT_SUM_DOC = ("each slice's tangent times its hits, added up in the order of PyTorch's CPU "
                         "at::sum and divided by the count once")


def dtype_constants(kernel) -> list[str]:
    """The loader's constants of the saved arrays' dtypes where forward's windows are known before
    it runs (a WindowKernel with static windows): the scan's index, the mask's count."""
    sel = kernel.selection
    return ([f"INDEX_DTYPE = np.{kernel.index_dtype}  # the winner's window-local index, saved per output"]
            if sel.form == "scan" else []) + (
        [f"COUNT_DTYPE = np.{kernel.count_dtype or ''}  # the number of elements attaining the extremum, "
         f"saved per output"] if sel.counts else [])


def adaptive_window_code() -> dict:
    """PyTorch's adaptive windows (geometry.ADAPTIVE) in the Python of the NumPy module's _axis,
    which the cpu loader includes too: each window's start and end, each element's first and end
    holder, and the docstring."""
    return dict(window_start=numpy_integer_code(ADAPTIVE.start), window_end=numpy_integer_code(ADAPTIVE.end),
                first_holder=numpy_integer_code(ADAPTIVE.first_holder),
                end_holder=numpy_integer_code(ADAPTIVE.end_holder),
                windows_doc=wrap(f'"""Along an axis of length `length` with `out` outputs (as '
                                 f'PyTorch\'s): {ADAPTIVE.doc()}."""', 96, ""))


# the NumPy module's arithmetic of the window starts: the samples as arrays (one per plane)
_FRACTIONAL_ARRAYS = replace(PYTHON, real=lambda s: f"real({s})", trunc=lambda s: f"({s}).astype(np.intp)")


def fractional_window_code(kernel) -> dict:
    """Fractional pooling's window starts per plane in the NumPy module's Python (its _windows:
    floating point), which the cpu loader includes too, with the input each sample is of and the
    docstring."""
    return dict(fractional={f: integer_code(getattr(kernel.axes, f), _FRACTIONAL_ARRAYS, {"u": "u[:, None]"})
                            for f in ("alpha", "start", "last_start")},
                sample_of=repr(kernel.sample_of),
                windows_doc=f"PyTorch's window starts along one axis, per plane: {kernel.sampling}.")
