"""The CPU backend: each op's kernel printed by ``printer.CPrinter`` into a C source (``templates/``:
OpenMP threads over planes, gather-form backward, float16 computed in float) and a small Python
loader with the NumPy module's interface, which compiles the .c with the system C compiler on
first use, keeps the shared library beside the cached module (named by its source's hash) and
calls it through ctypes on NumPy arrays.

One context function per form of lowered kernel (``_CONTEXTS``, keyed by ``lower.kernel_form``:
the kernel's type, or a window kernel's windows), each naming its two templates.  The window forms
but strided windows (rows, blocks, spans, sampled windows) share one select-and-gather skeleton,
``select.c.jinja``, and one loader skeleton, ``loader_select.py.jinja`` (``_select_parts``): each
names only its geometry partials (``_select_<geometry>.c.jinja``, ``_loader_<geometry>.py.jinja``)
and finished strings, the scan or mask and the counting of hits being partials chosen from the
lowered Selection.  What every form shares is in the partials (``_head``, ``_includes``,
``_scalar``, ``_library``; every loader starts with host/_preamble).  Forms not built yet are refused with a ValueError
naming the ones there are."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
import numpy as np
import sympy as sp

from ... import geometry, naming
from ...geometry import ADAPTIVE
from ...indicators import MaxOf, MinOf
from ...lower import (BEST, COUNT, EXTREMUM, GRAD_OUTPUT, HIT, V, ElementwiseKernel, OrderKernel, UnpoolKernel,
                     WindowKernel, backward_plan, form_of, kernel_form)
from ..cfamily import padding_strings
from ..cfamily.naming import c_identifiers, c_names
from ..common import (docstring, environment, expression_docstring, expression_header, grad_start_comment,
                      header, order_docstring, python_geometry, special_docstring, wrap)
from ..host import (NUMPY_ARRAYS, TORCH_TANGENT_SUM_DOC, adaptive_window_code, bfloat16_context,
                    bfloat16_kernels, computes_bfloat16, dtype_constants, fractional_window_code,
                    host_partials, lse_half_partial, preamble_context)
from ..host.printer import numpy_code
from ..printing import pool_axis_code, python_integer_code
from .printer import C_REAL_TYPES, c_code, c_integer_code, c_real_geometry_code, uses_exp

if TYPE_CHECKING:  # annotations only: the lowering makes the Artifacts a backend reads
    from ...ops import Op
    from ...lower import Artifacts

# the compiler's flags, stated in the .c header and used by the loader: no -ffast-math and no FMA
# contraction, so every operation rounds as NumPy's; no -march=native (the library stays portable).
# -fno-trapping-math: no floating-point trap is enabled (nor in NumPy), so the compiler may compute
# both arms of a select and an operand behind a || (values and rounding unchanged): the loops of
# conditional float operations (leaky_relu's x > 0 ? x : 0.01f * x, abs, a NaN test before a
# comparison, a window's running max) vectorize instead of branching per element (leaky_relu
# forward, 16M float32: 85 -> 5.4 ms, amax over dim -1 of 4096x4096: 14.5 -> 6 ms)
CFLAGS = ("-O3", "-std=c11", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
          "-fno-trapping-math")
# elementwise kernels also without partial redundancy elimination: with -fno-trapping-math, gcc
# 12's PRE moves grad_output's load into one arm of a select (hardtanh's, relu6's backward), a
# conditional load that the SSE2 vectorizer refuses (7.2 -> 77 ms on 16M float32); the window
# kinds keep it (amax's loops vectorize only with it)
ELEMENTWISE_CFLAGS = CFLAGS + ("-fno-tree-pre",)


def cflags(op: Op) -> tuple[str, ...]:
    """The compiler's flags for an op's source (its header states them, its loader uses them)."""
    return ELEMENTWISE_CFLAGS if form_of(op.spec.strategy) == ElementwiseKernel.__name__ else CFLAGS


# (name in kernel names, storage type, compute type, load, store): float16 as its bits, computed in float
C_DTYPES = (("f16", "sg_half", "float", "sg_half_to_float(v)", "sg_float_to_half(v)"),
            ("f32", "float", "float", "v", "v"),
            ("f64", "double", "double", "v", "v"))
# max pooling's backward of whole-bfloat16 calls (scan form): bfloat16 as its bits, computed in float
# (the helpers _B16_HELPERS); forward and jvp go through the float32 kernels (the bfloat16 wrappers)
B16 = ("b16", "sg_bf16", "float", "sg_bf16_to_float(v)", "sg_float_to_bf16(v)")
# ... and float16's scatter and gather backward compiled a second time with F16C's conversions
# (x86-64 with GCC; chosen when the library runs, where the CPU has F16C: _F16C_HELPERS)
F16C = ("f16c", "sg_half", "float", "sg_f16c_to_float(v)", "sg_float_to_f16c(v)")
POOL_DTYPES = C_DTYPES + (B16, F16C)
C_LAYOUTS = (("nchw", "false"), ("nhwc", "true"))  # channels-last: cl = true
# the loader's standard-library imports (it compiles, caches and calls the library through ctypes)
LOADER_IMPORTS = ("import ctypes", "import functools", "import hashlib", "import math", "import os", "import shutil",
                  "import subprocess", "import tempfile", "import threading", "from pathlib import Path")
_C_INTEGER_TYPES = {"uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
                    "int64": "int64_t"}


# ----------------------------------------------------------------------------- threads
#
# A loader's call runs its kernels on: its threads= argument, else the module's THREADS, else
# $SYMGRAD_NUM_THREADS, else OpenMP's default (OMP_NUM_THREADS, else every core).  symgrad.torch
# and symgrad.jax, which have thread pools of their own, pass one (framework_threads).

THREADS_ENV = "SYMGRAD_NUM_THREADS"


def env_threads() -> int | None:
    """$SYMGRAD_NUM_THREADS: the kernels' thread count where a call names none (None: unset or
    empty); a ValueError unless it is a positive integer."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ValueError(f"${THREADS_ENV} must be a positive integer (the cpu backend's threads), got {value!r}")
    return int(value)


def requested_threads(op: str, threads) -> int:
    """The thread count a loader's call asks for: threads (an int >= 1: else a ValueError, or a
    TypeError for a non-integer), else $SYMGRAD_NUM_THREADS, else 0 (OpenMP's default)."""
    if type(threads) is int and threads >= 1:  # the usual case first (a frameworks' call passes one)
        return threads
    if threads is None:
        return env_threads() or 0
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"{op}: threads must be a positive int or None, got {type(threads).__name__}")
    if threads < 1:
        raise ValueError(f"{op}: threads must be a positive int or None, got {int(threads)}")
    return int(threads)


def framework_threads(module, default) -> dict:
    """The keyword arguments for a call of module from a framework with a thread pool of its own:
    {"threads": n} for the cpu backend's modules (those with THREADS), n being the module's
    THREADS, else $SYMGRAD_NUM_THREADS, else default() (the framework's count); {} for others."""
    if not hasattr(module, "THREADS"):
        return {}
    threads = module.THREADS if module.THREADS is not None else env_threads()
    return {"threads": threads if threads is not None else default()}


@functools.lru_cache(maxsize=None)
def max_threads() -> int:
    """The most threads a kernel call runs: the CPUs this process may run on (more only wait for
    each other; results do not depend on the count, and libgomp crashed on 100000 threads)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


_threads_ran_in: int | None = None  # the process whose kernels ran OpenMP threads (one libgomp for all)


def kernel_threads(threads: int) -> int:
    """The thread count handed to a kernel (0: OpenMP's default): threads, at most max_threads();
    1 in a process forked after its parent's kernels ran OpenMP threads, since GNU libgomp's
    thread pool does not survive fork() (a parallel region of several threads there waits forever
    for threads the child does not have; one thread runs without the pool), noting the process
    when it asks for more than one.  Every loader calls it, so the note covers every op's library."""
    global _threads_ran_in
    if threads == 1:  # one thread: no pool to miss in a child nor to note (no os.getpid a call)
        return 1
    pid = os.getpid()
    if _threads_ran_in is not None and _threads_ran_in != pid:
        return 1
    if threads != 1:
        _threads_ran_in = pid
    return min(threads, max_threads())


def source_name(op: Op) -> str:
    """The C source of an op: <module>.c."""
    return naming.module_name(op) + ".c"


def loader_name(op: Op) -> str:
    """The loader of an op: <module>_cpu.py (apart from the NumPy module's name)."""
    return naming.module_name(op) + "_cpu.py"


def file_names(op: Op) -> tuple[str, ...]:
    """The C source and the loader (imported last)."""
    return (source_name(op), loader_name(op))


def check_form(op: Op) -> None:
    """A ValueError naming the forms there are, for an op whose kernel's form (lower.form_of) this
    backend does not build yet."""
    if form_of(op.spec.strategy) not in FORMS:
        raise ValueError(f"the cpu backend builds the {', '.join(FORMS)} forms only so far "
                         f"({op.name}'s kernel is of form {form_of(op.spec.strategy)!r}); use "
                         f"backend='numpy' for it")


def _environment() -> jinja2.Environment:
    """This package's templates as ``cpu/<file>``, with the shared ones (``host/``: the loader's
    Python, ``cfamily/``) that common.environment gives every backend."""
    return environment("cpu", Path(__file__).parent / "templates")


# the head of the loader's _sizes (host/_pool_sizes.py.jinja): kept per shape
_POOL_SIZES_HEAD = ["@functools.lru_cache(maxsize=256)", "def _sizes(shape: tuple):",
                    '    """(batched input shape, output spatial sizes) of an input shape (a tuple of ints), computed',
                    '    once per shape (a ValueError is not kept: it is raised again)."""']


def _params(real_type: str, *names) -> str:
    return ", ".join(f"const {real_type} {n}" for n in names)


def _selection(kernel: WindowKernel, combine: sp.Basic | None = None,
               branch_free_fold: bool = False) -> tuple[list, list]:
    """The selection as C functions, once per compute type (a name suffixed by it: C has no
    overloading): (docs, [{name, functions: [{ret, name, params, body}]}]).  combine: the fold's
    step (default: the NaN-propagating max/min of best and v).

    sg_hit and sg_weight are printed branch-free (the printer's branch_free: selects of bits, &
    and |): each is one element's own value, so a jump on the data's comparisons is only a
    misprediction as often as the data decides (max_pool2d split's backward, 64x16x8x8 float32
    on inputs that change between calls: 300-360 -> 82 us).  The fold (sg_combine) and sg_take
    carry the running winner from element to element: branch-free, that is one dependency chain
    a window, where a predicted branch runs ahead (a large window's running max seldom changes:
    adaptive_max_pool2d split forward 456 -> 740 us, max_pool2d first k3 s2 p1 1150 -> 3500 us
    branch-free), so they are printed with branches unless branch_free_fold (max pooling, both
    forms: its row pass folds the windows of a row side by side, and 2x2 windows' comparisons are
    coin flips: split forward 300-325 -> 130 us; the scan form's fold, under the jax preset,
    64x16x8x8 260 -> 123 us and 32x16x32x32 k3 s2 p1 4300 -> 1900 us)."""
    sel = kernel.selection
    fold = MaxOf if sel.extremum == "max" else MinOf
    count = [COUNT] if sel.counts else []
    # (doc, return type, name, parameters, expression, prelude, branch-free)
    functions = [("sg_combine(best, v): the window's extremum so far, NaN propagating",
                  "{rt}", "sg_combine", (BEST, V), fold(BEST, V) if combine is None else combine, (),
                  branch_free_fold)]
    if sel.form == "scan":
        functions.append(("sg_take(v, best): a later element v takes over from the running winner best",
                          "bool", "sg_take", (V, BEST), sel.take, (), False))
    else:
        functions += [
            ("sg_hit(v, extremum): an element attains its window's extremum",
             "bool", "sg_hit", (V, EXTREMUM), sel.hit, (), True),
            (f"sg_weight(grad_output, v, extremum{', count' if sel.counts else ''}): the gradient of "
             f"element v of a window", "{rt}", "sg_weight", (GRAD_OUTPUT, V, EXTREMUM, *count), sel.weight,
             (f"const bool {HIT} = sg_hit_{{rt}}(v, extremum);",), True)]
    real_types = [{"name": rt, "functions": [
        {"ret": ret.format(rt=rt), "name": f"{name}_{rt}", "params": _params(rt, *map(str, params)),
         "body": [*(line.format(rt=rt) for line in prelude), f"return {c_code(expr, rt, branch_free=free)};"]}
        for _, ret, name, params, expr, prelude, free in functions]} for rt in C_REAL_TYPES]
    return [f[0] for f in functions], real_types


def _signatures(writes: list, reads: list) -> dict:
    """The kernels' finished parameter lists, per data type, and their documentation: what forward
    saves (writes) and what backward and jvp read, each [(name, C type, "T" for the data type)]."""
    def params(arrays, const, ctype):
        return "".join(f"{const}{ctype if c == 'T' else c}* restrict {name}, " for name, c in arrays)

    def doc(arrays, const):
        return "".join(f"{const}{c}* {name}, " for name, c in arrays)

    return {"writes_doc": doc(writes, ""), "reads_doc": doc(reads, "const "),
            "writes": {dt: params(writes, "", ct) for dt, ct, *_ in POOL_DTYPES},
            "reads": {dt: params(reads, "const ", ct) for dt, ct, *_ in POOL_DTYPES}}


def _saved(kernel: WindowKernel, index_ctype: str, count_ctype: str) -> dict:
    """What forward saves and backward and jvp read, as the kernels' finished parameter lists (per
    data type) and arguments, and the loader's Saved fields and arrays."""
    sel = kernel.selection
    scan = sel.form == "scan"
    counted = [("count", count_ctype)] if sel.counts else []
    writes = [("index", index_ctype)] if scan else counted
    reads = [("index", index_ctype)] if scan else [("x", "T"), ("output", "T")] + counted

    return _signatures(writes, reads) | {
        "writes_args": "".join(f"{name}, " for name, _ in writes),
        "reads_args": "".join(f"{name}, " for name, _ in reads),
        # sg_weight's count argument, at an output position o (backward) or t (jvp)
        "count_at": {rt: (f", ({rt})count[o]" if sel.counts else "") for rt in C_REAL_TYPES},
        "count_at_t": {rt: (f", ({rt})count[t]" if sel.counts else "") for rt in C_REAL_TYPES},
        # the loader: Saved's array fields, what forward allocates (field, dtype constant), and
        # each saved array's (field, "in" or "out" shape, dtype, bound of its values)
        "fields": [name for name, _ in reads],
        # what forward's Saved holds in each field: the unbatched input, the output, a saved array
        "forward_values": [{"x": "xu", "output": "y"}.get(name, f"unbatched({name})") for name, _ in reads],
        "writes_fields": [name for name, _ in writes],
        "allocates": [(name, {"index": "INDEX_DTYPE", "count": "COUNT_DTYPE"}[name]) for name, _ in writes],
        "arrays": ([("index", "out", "INDEX_DTYPE", str(kernel.window))] if scan else
                   [("x", "in", "saved.dtype", "None"), ("output", "out", "saved.dtype", "None")]
                   + ([("count", "out", "COUNT_DTYPE", str(kernel.window + 1))] if sel.counts else [])),
        "keeps": ("the window-local index of each output's winner" if scan else
                  "the input and the output (by reference)" + (", and the count of each window's "
                                                               "winners" if sel.counts else "")),
    }


def _inner_rows(g, a: int) -> dict:
    """Backward's row form along the last axis a: the row's elements x = r + S * m (r the residue
    modulo the stride), whose offset q (geometry.offset) is q_r + S * m.  The geometry's holds
    (q >= 0, Mod(q, s) == 0, holder < out) with its holder floor(q / s) = m + q_r / s, and the
    row's end (x < length), solved for m: the residue holds iff q_r % S == 0, and then the
    windows m + shift hold element k of x = r + S * m for m in [lo, hi)."""
    names = {"j": f"k{a}", "x": "r", "k": f"K{a}", "s": f"S{a}", "p": f"P{a}", "d": f"D{a}"}
    q, s, out, length = f"q{a}", f"S{a}", f"o{a}", f"l{a}"
    inside = {"j": f"k{a}", "out": f"o{a}", "length": f"l{a}", "k": f"K{a}", "s": f"S{a}", "p": f"P{a}", "d": f"D{a}"}
    return {"first_inside": c_integer_code(g.first_inside, inside),  # forward: the windows whose
            "end_inside": c_integer_code(g.end_inside, inside),  # element k is inside the input
            "offset_at_r": c_integer_code(g.offset, names),
            "not_divisible": f"{q} % {s} != 0",
            "shift": f"{q} / {s}",
            "m_lo": "(shift < 0 ? -shift : 0)",
            "m_hi": f"sg_min({out} - shift, ({length} - r + {s} - 1) / {s})"}


def _band_windows(g) -> dict:
    """Scatter-form backward's band of input rows [r0, r1) along spatial dim 0: the windows that
    hold one of its rows, [first, end).  Element j of window i is the geometry's coordinate, linear
    in i with step s: first is the first window whose last element (j = k - 1) reaches r0, end the
    first whose element 0 is at r1 or beyond, both clamped to [0, out]."""
    from ...geometry import I, J, K, OUT
    step = sp.diff(g.coordinate, I)
    start = g.coordinate - I * step
    r0, r1 = sp.symbols("r0 r1", integer=True, nonnegative=True)
    first = sp.Min(OUT, sp.Max(0, sp.ceiling((r0 - start.subs(J, K - 1)) / step)))
    end = sp.Min(OUT, sp.Max(0, sp.ceiling((r1 - start.subs(J, 0)) / step)))
    names = {"k": "K0", "s": "S0", "p": "P0", "d": "D0", "out": "o0"}
    return {"first": c_integer_code(first, names), "end": c_integer_code(end, names)}


_BACKWARD_DOCS = {  # the .c header's words on its backward form
    "write": ("backward is in write form (the windows tile the input): each input element is "
              "written once, its window's gradient where it is the winner, else +0 (no zeroing pass); "
              "it returns -1 where it read a saved index outside the window (checked in this pass)."),
    "scatter": ("backward is in scatter form: a band of input rows is zeroed, then each window "
                "holding one of its rows adds its gradient to its winner, in output order "
                "(no atomic operation: each band is one thread's); it returns -1 where it read a "
                "saved index outside the window (checked in this pass)."),
    "gather": ("backward is in gather form: each input element visits the windows holding it "
               "(no atomic operation, no zeroing pass)."),
    "mask_write": ("backward is in write form (the windows tile the input): each input element is "
                   "written once, +0 plus its window's term (the gather form's sum of the one window "
                   "holding it), +0 past the last window (no zeroing pass)."),
}


def _backward_form(selection_form: str, tiles: bool) -> str:
    """Max pooling's backward form (_BACKWARD_DOCS' key, the partial's name): write where the
    windows tile the input, else scatter (the scan form: a saved winner) or gather (the mask form)."""
    if selection_form == "scan":
        return "write" if tiles else "scatter"
    return "mask_write" if tiles else "gather"


def _tiles(op: Op) -> bool:
    """The windows tile the input: along every dim, adjacent (stride = kernel size, no dilation),
    none reaching outside it (no padding, floor mode); only the rest past the last window is in
    no window."""
    p = op.params
    return (not p.get("ceil_mode", False) and all(pd == 0 for pd in p["padding"])
            and all(d == 1 for d in p["dilation"]) and tuple(p["stride"]) == tuple(p["kernel_size"]))


def _scatter_accumulators(kernel: WindowKernel) -> dict:
    """Scatter-form backward's sums, per data type: in grad_x itself where the compute type is the
    storage type or each add rounds to the storage type (float16; bfloat16 under bfloat16_adds:
    the sum loaded, added to, stored at each add, no scratch and no pass to store it), else
    (bfloat16 rounded once) in a float scratch band per thread, stored into grad_x."""
    out = {}
    for name, ctype, acc, *_ in POOL_DTYPES:
        apart = ctype != acc and not _rounds_each_add(kernel, name)
        direct = ctype != acc and not apart  # in grad_x, converted at each add
        out[name] = {
            "doc": (f"{name}: the sums in a {acc} scratch band per thread, stored into grad_x." if apart else
                    f"{name}: the sums are made in grad_x itself, each add rounded to {ctype} (as the NumPy module's)."
                    if direct else f"{name}: the sums are made in grad_x itself."),
            "sum_type": acc if apart else ctype,
            **_scatter_branches(name, direct),
            # whether a gradient the band's windows add is a NaN (sg_add_fast_<dt> where none is)
            "nan": (f"const bool g_nan = sg_any_nan_{name}(grad_output + ob + first * os.s0, (end - first) * os.s0);"
                    if direct and name in _SCATTER_ADD_NAN else None),
            "accumulator": "scratch" if apart else "region",
            "store": ([f"for (I e = 0; e < size; ++e) region[e] = sg_store_{name}(acc[e]);  // rounded once"]
                      if apart else []),
            "alloc": (f"({acc}*)malloc(sizeof({acc}) * (size_t)(((l0 + bands - 1) / bands) * s0 + 1))"
                      if apart else "NULL"),
            "missing": "scratch == NULL" if apart else "false",
        }
    return out


def _scatter_branches(name: str, direct: bool) -> dict:
    """The scatter's loops over a band's windows (branches: each branch's opening line and add;
    close: the line after the last; pad: the loops' indent in a branch).  Where a NaN among the
    band's gradients is tested (_SCATTER_ADD_NAN) the loops come twice, unswitched: sg_add_<dt>
    where there is one, sg_add_fast_<dt> where none (case B's float16 kernel alone, C harness
    under load: 0.66 -> 0.57 ms; the test per add kept it from being one loop of adds)."""
    if direct and name in _SCATTER_ADD_NAN:
        return {"branches": [
            {"open": "if (g_nan) {  // a NaN among the gradients the band's windows add: each add tests its sum",
             "add": f"*sum = sg_add_{name}(*sum, grad_output[o]);"},
            {"open": "} else {  // none: the same loops, no NaN test per add",
             "add": f"*sum = sg_add_fast_{name}(*sum, grad_output[o]);"}],
            "close": "}", "pad": "  "}
    add = f"*sum = sg_add_{name}(*sum, grad_output[o]);" if direct else f"*sum += sg_load_{name}(grad_output[o]);"
    return {"branches": [{"open": "", "add": add}], "close": "", "pad": ""}


def _rounds_each_add(kernel: WindowKernel, name: str) -> bool:
    """Whether a sum of windows' gradients in data type name rounds to its storage type after each
    add, as the NumPy module's: float16 always (NumPy's float16 adds), bfloat16 where the preset
    adds in bfloat16 (bfloat16_adds; else in float32, the sum rounded once)."""
    return name in ("f16", "f16c") or (name == "b16" and kernel.bfloat16_adds == "bfloat16")


def _loader_note(op: Op, layout: str, over: str, extra: str = "") -> list[str]:
    """The loader's docstring note, the same for every kind but the memory layouts it takes
    (layout, after the dtypes), what its threads share out (over) and an extra remark."""
    return wrap(
        f"CPU backend: forward, backward and jvp take and return NumPy arrays (float16, float32, "
        f"float64{layout}) and run the C kernels of {source_name(op)}, compiled with the system C "
        f"compiler on first use (flags: {' '.join(cflags(op))}) and kept beside this module, named by "
        f"the source's hash.  threads: OpenMP threads over {over} (default: THREADS, else "
        f"${THREADS_ENV}, else OpenMP's default; at most the CPUs this process may use; 1 in a "
        f"process forked after OpenMP threads ran, where libgomp's threads are gone); results do "
        f"not depend on it." + extra, indent="")


def _selection_parts(kernel: WindowKernel, jvp_scan: str, jvp_mask: str) -> dict:
    """What the lowered Selection decides for a kind's templates, as the partials they import (the
    hits counted or not; the loader's scan or mask parts) and finished lines: the winner's
    constant (scan form only), jvp's docstring phrase (jvp_scan or jvp_mask)."""
    sel = kernel.selection
    scan = sel.form == "scan"
    winner = ("the winner's value is the output" if sel.winner_is_output else
              "the output is the fold of the window (NaN propagating), not the winner's "
              "value: under this NaN rule a window holding NaN can have a number as its winner")
    return {
        "c_count_partial": "cpu/_count.c.jinja" if sel.counts else "cpu/_no_count.c.jinja",
        "loader_partial": f"cpu/_loader_{sel.form}.py.jinja",
        "winner_lines": ([f"static const bool WINNER_IS_OUTPUT = {'true' if sel.winner_is_output else 'false'};"
                          f"  // {winner}"] if scan else []),
        "jvp_doc": jvp_scan if scan else jvp_mask,
    }


def _typedefs(index_ctype: str, count_ctype: str) -> list[str]:
    """The C typedefs of the saved arrays' element types there are (an empty type: none)."""
    return ([f"typedef {index_ctype} index_t;  // saved: the winner's window-local index"] if index_ctype else []) + (
        [f"typedef {count_ctype} count_t;  // saved: the number of elements attaining the extremum"]
        if count_ctype else [])


# the select skeleton's backward forms: the partial, the .c header's words and the kernel's comment
_SELECT_BACKWARD = {
    "gather": {"backward_partial": "cpu/_backward_gather.c.jinja",
               "backward_form_doc": wrap("backward is in gather form: each input element visits the windows "
                                    "holding it in output (row-major) order (no atomic operation, no "
                                    "zeroing pass).", 92, ""),
               "backward_comment": "Gather form: one input element a step visits the windows holding it, in output order."},
    "write": {"backward_partial": "cpu/_backward_write.c.jinja",
              "backward_form_doc": wrap("backward is in write form: every element is in one window, and "
                                        "each window writes its elements' gradients (no atomic operation, "
                                        "no zeroing pass).", 92, ""),
              "backward_comment": "Write form: one window a step writes the gradients of its elements."},
    "scatter": {"backward_partial": "cpu/_backward_scatter.c.jinja",
                "backward_form_doc": wrap("backward is in scatter form: one thread a plane, each window adding "
                                     "its terms to the plane's gradient (a buffer of the compute type) in "
                                     "output (row-major) order, the order of the NumPy module's np.add.at "
                                     "(no atomic operation).", 92, ""),
                "backward_comment": "Scatter form: one plane a step, its windows adding their terms in output order."},
}


def _layouts() -> list[dict]:
    """The memory layouts a window kind's kernels are built for, with their names' suffixes."""
    return [{"name": n, "cl": cl, "suffix": f"_{n}"} for n, cl in C_LAYOUTS]


# the select skeleton's geometry partial of each form of windows (WindowKernel.windows)
_SELECT_GEOMETRY = {"rows": "cpu/_select_reduction.c.jinja", "blocks": "cpu/_select_maxout.c.jinja",
                    "spans": "cpu/_select_adaptive.c.jinja", "sampled": "cpu/_select_fractional.c.jinja"}


def _select_parts(kernel: WindowKernel, ctx: dict) -> dict:
    """The context of a window kind on the one select-and-gather skeleton (templates/select.c.jinja):
    its geometry partial (_select_<geometry>), the selection partial of the lowered Selection's form
    and the counting partial (hits counted again by backward and jvp; or, where the kind's forward
    saves them, read), over the kind's own finished strings (ctx)."""
    sel = kernel.selection
    saved_counts = sel.counts and "count" in ctx["saved"].get("fields", ())
    return {"template": "cpu/select.c.jinja", "loader_template": "cpu/loader_select.py.jinja",
            "param_comment": "",
            "geometry_partial": _SELECT_GEOMETRY[kernel.windows],
            "selection_partial": f"cpu/_select_{sel.form}.c.jinja",
            "geometry_params": "", "accumulate_partial": "cpu/_gather_sum.c.jinja",
            # a reduction's fold in SIMD lanes, its forward compiled for each SIMD width (_row_lanes)
            "lane_helpers": [], "row_lanes": {}, "forward_clones": {},
            "window_lanes": {},  # a scan's prefilter in SIMD lanes (_window_lanes)
            **_SELECT_BACKWARD["gather"], **ctx,
            "c_count_partial": ("cpu/_count_saved.c.jinja" if saved_counts else
                                "cpu/_count.c.jinja" if sel.counts else "cpu/_no_count.c.jinja")}


# bfloat16 as its bits: widened exactly, rounded to nearest even (a NaN to the quiet NaN of its sign,
# as ml_dtypes rounds it), and +0 + v on the bits (the write form: +0 for -0, that quiet NaN for a NaN)
_B16_HELPERS = [
    "typedef uint16_t sg_bf16;  // bfloat16 as its bits",
    "SG_INLINE float sg_bf16_to_float(const sg_bf16 h) { return sg_uint_as_float((uint32_t)h << 16); }",
    "SG_INLINE sg_bf16 sg_float_to_bf16(const float f) {",
    "  const uint32_t u = sg_float_as_uint(f);",
    "  const uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;",
    "  return (sg_bf16)sg_blend((u & 0x7fffffffu) > 0x7f800000u, nan, (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);",
    "}",
    "SG_INLINE float sg_load_b16(const sg_bf16 v) { return sg_bf16_to_float(v); }",
    "SG_INLINE sg_bf16 sg_store_b16(const float v) { return sg_float_to_bf16(v); }",
    "SG_INLINE sg_bf16 sg_zero_plus_b16(const sg_bf16 h) {  // in 16-bit lanes, as sg_zero_plus_half",
    "  const uint16_t nan = (uint16_t)-(uint16_t)((uint16_t)(h & 0x7fffu) > 0x7f80u);",
    "  const uint16_t minus_zero = (uint16_t)-(uint16_t)(h == 0x8000u);",
    "  return (sg_bf16)(((uint16_t)(0x7fc0u | (h & 0x8000u)) & nan) | (h & (uint16_t)~nan & (uint16_t)~minus_zero));",
    "}",
    "SG_INLINE sg_bf16 sg_keep_b16(const bool keep, const sg_bf16 h) {",
    "  return (sg_bf16)(h & (uint16_t)-(uint16_t)keep);",
    "}",
]


# max pooling's sums of windows' gradients, per data type: each add rounded as the NumPy module
# rounds it: float16 to float16 (np.add in float16: the float sum rounded to the nearest half),
# bfloat16 to bfloat16 where the preset adds in bfloat16 (bfloat16_adds; else in float32, the sum
# rounded once), float32 and float64 in their own type.  sg_round_<dt>(v): v so rounded, in the
# compute type.
def _pool_rounding(kernel: WindowKernel) -> dict:
    """The C helper that rounds a sum of windows' gradients, per data type (in the compute type),
    and where each add rounds, the scatter form's add on the bits (sg_add_<dt>)."""
    out = {}
    for name, ctype, acc, *_ in POOL_DTYPES:
        rounds = ctype != acc and _rounds_each_add(kernel, name)
        body = f"sg_load_{name}(sg_store_{name}(v))" if rounds else "v"
        out[name] = [f"SG_INLINE {acc} sg_round_{name}(const {acc} v) {{ return {body}; }}  "
                     f"// a sum of windows' gradients, each add rounded so"] + (_scatter_add(name, ctype) if rounds else [])
    return out


# The scatter form's add of a window's gradient to its winner's sum, on the bits: sg_store_<dt>(
# sg_load_<dt>(sum) + sg_load_<dt>(v)), the same bits; F16C's and bfloat16's take a NaN sum's quiet
# NaN of its sign on a branch a number never takes, in place of sg_float_to_<dt>'s select of the
# bits (a third of the scatter's work per window: case B 8x64x56x56 k3 s2 p1's kernel, float16
# 0.96 -> 0.68 ms, bfloat16 1.30 -> 0.87 ms, one thread).  Where no gradient a band's windows add
# is a NaN (sg_any_nan_<dt>, one pass over them), a NaN sum can only be the default NaN of inf - inf
# (payload 0, already the quiet NaN of its sign): sg_add_fast_<dt> rounds with no NaN test (float16
# 0.68 -> 0.60 ms, bfloat16 0.87 -> 0.83 ms).  Per data type: the rounded sum's bits, the test
# of a NaN sum, its quiet NaN, the bits rounded, and the test of a stored NaN.
_SCATTER_ADD_NAN = {
    "f16c": ("const uint32_t h = _cvtss_sh(sg_f16c_to_float(sum) + sg_f16c_to_float(v), _MM_FROUND_TO_NEAREST_INT);",
             "(h & 0x7fffu) > 0x7c00u", "(h & 0x8000u) | 0x7e00u", "h", "(g[e] & 0x7fffu) > 0x7c00u"),
    "b16": ("const uint32_t u = sg_float_as_uint(sg_bf16_to_float(sum) + sg_bf16_to_float(v));",
            "(u & 0x7fffffffu) > 0x7f800000u", "((u >> 16) & 0x8000u) | 0x7fc0u", "(u + 0x7fffu + ((u >> 16) & 1u)) >> 16",
            "(g[e] & 0x7fffu) > 0x7f80u"),
}


# sg_add_fast_<dt> in xmm registers, the same operations on the same bits: the halves inserted
# into a zeroed register (bfloat16: as the high half of a float's bits), added with addss,
# rounded there (bfloat16: SSE2's 32-bit adds of the bits' rounding; float16: vcvtps2ph) and
# the result's 16 bits extracted, where the portable helpers move each value between integer and
# xmm registers three times (case B's kernel alone, C harness under load: bfloat16 0.84 -> 0.59 ms,
# float16 0.565 -> 0.54 ms).  Per data type: the guard (None: the F16C section's), the body.
_SCATTER_ADD_FAST_XMM = {
    "b16": ("defined(__SSE2__)", [
        "  const __m128 a = _mm_castsi128_ps(_mm_insert_epi16(_mm_setzero_si128(), sum, 1));",
        "  const __m128 b = _mm_castsi128_ps(_mm_insert_epi16(_mm_setzero_si128(), v, 1));",
        "  const __m128i u = _mm_castps_si128(_mm_add_ss(a, b));",
        "  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1));",
        "  return (sg_bf16)_mm_extract_epi16(_mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7fff)), lsb), 1);"]),
    "f16c": (None, [
        "  const __m128 a = _mm_cvtph_ps(_mm_insert_epi16(_mm_setzero_si128(), sum, 0));",
        "  const __m128 b = _mm_cvtph_ps(_mm_insert_epi16(_mm_setzero_si128(), v, 0));",
        "  return (sg_half)_mm_extract_epi16(_mm_cvtps_ph(_mm_add_ss(a, b), _MM_FROUND_TO_NEAREST_INT), 0);"]),
}


def _scatter_add_fast(name: str, ctype: str, bits: str, rounded: str) -> list[str]:
    """sg_add_fast_<name>: in xmm registers (_SCATTER_ADD_FAST_XMM) where its guard holds, else on
    the bits in integer registers."""
    head = (f"SG_INLINE {ctype} sg_add_fast_{name}(const {ctype} sum, const {ctype} v) {{  "
            f"// sg_add_{name} where no NaN but a quiet NaN of payload 0 comes in")
    portable = [head, f"  {bits}", f"  return ({ctype})({rounded});", "}"]
    if name not in _SCATTER_ADD_FAST_XMM:
        return portable
    guard, body = _SCATTER_ADD_FAST_XMM[name]
    fast = [head.replace("comes in", "comes in, in xmm registers"), *body, "}"]
    return fast if guard is None else [f"#if {guard}", "#include <emmintrin.h>", *fast, "#else", *portable, "#endif"]


def _scatter_add(name: str, ctype: str) -> list[str]:
    """sg_add_<name>(sum, v): the scatter form's rounded add on the bits, and where _SCATTER_ADD_NAN
    has name, sg_add_fast_<name> (no NaN among the gradients) and sg_any_nan_<name>."""
    head = f"SG_INLINE {ctype} sg_add_{name}(const {ctype} sum, const {ctype} v) {{"
    if name not in _SCATTER_ADD_NAN:
        return [f"{head} return sg_store_{name}(sg_load_{name}(sum) + sg_load_{name}(v)); }}"]
    bits, nan, quiet, rounded, stored_nan = _SCATTER_ADD_NAN[name]
    return [f"{head}  // sg_store_{name}(sg_load_{name}(sum) + sg_load_{name}(v)), a NaN on a branch",
            f"  {bits}", f"  if (__builtin_expect({nan}, 0)) return ({ctype})({quiet});",
            f"  return ({ctype})({rounded});", "}",
            *_scatter_add_fast(name, ctype, bits, rounded),
            f"SG_INLINE bool sg_any_nan_{name}(const {ctype}* restrict g, const I n) {{  // whether g[0..n) holds a NaN",
            "  unsigned any = 0;", f"  for (I e = 0; e < n; ++e) any |= (unsigned)({stored_nan});", "  return any != 0;", "}"]


# float16 through F16C's conversions (vcvtph2ps, vcvtps2ph: exact, and rounding to nearest even),
# a NaN stored as the quiet NaN of its sign as sg_float_to_half stores it: the same bits as the
# portable helpers; the functions between the pragmas are compiled for F16C (GCC on x86-64)
_F16C_HELPERS = [
    "SG_INLINE float sg_f16c_to_float(const sg_half h) { return _cvtsh_ss(h); }",
    "SG_INLINE sg_half sg_float_to_f16c(const float f) {",
    "  const uint32_t h = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);",
    "  return (sg_half)sg_blend((h & 0x7fffu) > 0x7c00u, (h & 0x8000u) | 0x7e00u, h);",
    "}",
    "SG_INLINE float sg_load_f16c(const sg_half v) { return sg_f16c_to_float(v); }",
    "SG_INLINE sg_half sg_store_f16c(const float v) { return sg_float_to_f16c(v); }",
]


def _pool_f16c(kernel: WindowKernel, tiles: bool) -> dict:
    """float16's backward with F16C's conversions (the scatter and gather forms, whose sums
    convert at each add; the write form works on the bits), or none."""
    fast = not (tiles and kernel.selection.form == "scan")
    # the kernels' data types; entry: the name of backward's exported kernels (float16's portable
    # ones f16_generic where F16C's are built, both called through f16's, which chooses)
    dtypes = [{"name": n, "ctype": c, "acc": a, "load": ld, "store": st,
               "entry": f"{n}_generic" if fast and n == "f16" else n} for n, c, a, ld, st in C_DTYPES]
    if not fast:
        return {"f16c": None, "dtypes": dtypes}
    name, ctype, acc, load, store = F16C
    return {"f16c": {"name": name, "ctype": ctype, "acc": acc, "load": load, "store": store,
                     "entry": "f16_f16c"},
            "f16c_helpers": _F16C_HELPERS, "dtypes": dtypes}


def _pool_b16(kernel: WindowKernel) -> dict:
    """The b16 backward kernels (scan form: whole-bfloat16 calls' backward on their bits) and
    their helpers, or none (the mask form: bfloat16 through the float32 kernels)."""
    if kernel.selection.form != "scan":
        return {"b16": None}
    name, ctype, acc, load, store = B16
    return {"b16": {"name": name, "ctype": ctype, "acc": acc, "load": load, "store": store, "entry": name},
            "b16_helpers": _B16_HELPERS}


def _base_context(art: Artifacts) -> dict:
    """What every kind's .c source and loader get: provenance, docstring, the op's names and
    parameters, the compiler's flags and the data types."""
    op = art.op
    if op.spec.strategy.expression:
        lines, doc = expression_header(op, "cpu"), expression_docstring(op, art.derivation)
    elif isinstance(art.kernel, OrderKernel):
        lines, doc = header(op, "cpu"), order_docstring(op, art.derivation, art.kernel)
    elif op.spec.strategy.special:
        lines, doc = header(op, "cpu"), special_docstring(op, art.derivation, art.kernel, half=True)
    else:
        lines, doc = header(op, "cpu"), docstring(op, art.derivation, art.kernel)
    return {
        "header_py": lines, "header": ["//" + line[1:] for line in lines],
        "docstring": doc,
        "op": op.name, "ties": op.ties, "params": repr(op.params),
        "inputs_tuple": repr(tuple(op.spec.inputs)), "piecewise_linear": art.piecewise_linear,
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "prefix": naming.module_name(op), "source_name": source_name(op), "loader_name": loader_name(op),
        "cflags": " ".join(cflags(op)), "cflags_tuple": repr(cflags(op)),
        "dtypes": [{"name": n, "ctype": c, "acc": a, "load": ld, "store": st} for n, c, a, ld, st in C_DTYPES],
    }


def _pool_context(art: Artifacts) -> dict:
    """Max pooling (1d/2d/3d): windows of kernel_size over NCHW or channels-last planes."""
    op, kernel = art.op, art.kernel
    assert isinstance(kernel, WindowKernel) and kernel.windows == "strided"
    spatial = op.spec.spatial
    g = kernel.axes
    g_names = {"i": "np.arange(out)[:, None]", "j": "np.arange(k)"}
    pool = [pool_axis_code(g, a, c_integer_code) for a in range(spatial)]
    return _base_context(art) | _pool_rows(spatial, pool) | {
        "template": "cpu/pool.c.jinja", "loader_template": "cpu/loader.py.jinja",
        "layouts": [{"name": n, "cl": cl} for n, cl in C_LAYOUTS],
        **_pool_selection_strings(kernel),
        **_pool_saved_strings(kernel),
        **_pool_loop_strings(spatial, kernel.window),
        "kernel_size": list(op.params["kernel_size"]), "stride": list(op.params["stride"]),
        "padding": list(op.params["padding"]), "dilation": list(op.params["dilation"]),
        "inner": _inner_rows(g, spatial - 1),
        **_pool_backward_strings(op, kernel),
        "loader_coordinates": python_integer_code(g.coordinate, g_names),
        "loader_inside": python_integer_code(g.inside, {"x": "position", "length": "L"}),
        "sizes_head": _POOL_SIZES_HEAD,
        "loader_note": _loader_note(op, "; NCHW or channels-last, other strides are copied", "the planes"),
        **python_geometry(kernel),
    } | dict(pool=pool)


def _pool_selection_strings(kernel: WindowKernel) -> dict:
    """Max pooling's selection: its docstring words and real types, the scan or mask partial, the
    padding's part in a window, the lowered Selection's parts and jvp's words."""
    sel = kernel.selection
    selection_doc, real_types = _selection(kernel, branch_free_fold=True)
    return {
        "selection_doc": selection_doc, "real_types": real_types,
        "selection_partial": f"cpu/_pool_{sel.form}.c.jinja",
        "window": kernel.window,
        **padding_strings(kernel),
        **_selection_parts(kernel, "the tangent of each window's winner",
                           "each window's weights applied to the tangent"),
        # the .c header's words on what jvp reads per output
        "jvp_reads": ("the tangent of its window's winner" if sel.form == "scan" else
                      "the tangent of every element of its window, weighted as backward weights "
                      "grad_output, in window-local order"),
    }


def _pool_saved_strings(kernel: WindowKernel) -> dict:
    """What max pooling's forward saves: the saved arrays' C typedefs, the loader's dtype constants,
    the kernels' saved parameters (_saved) and the loader's words on the saved state."""
    sel = kernel.selection
    count_dtype = kernel.count_dtype or ""
    index_ctype = _C_INTEGER_TYPES[kernel.index_dtype] if kernel.index_dtype else ""
    count_ctype = _C_INTEGER_TYPES[count_dtype] if count_dtype else ""
    if sel.form == "scan":
        saved_text = (f"Saved state: forward saves the winner's window-local index, one "
                      f"{kernel.index_dtype} per output; backward reads only it and grad_output "
                      f"(x is not kept).")
    else:
        saved_text = ("Saved state: backward recomputes from x and the output (both kept by "
                      "reference) which elements attain each window's extremum"
                      + (f"; forward also saves their number, one {count_dtype} per output."
                         if sel.counts else "."))
    return {
        "typedefs": _typedefs(index_ctype, count_ctype),
        "dtype_constants": dtype_constants(kernel),
        "saved": _saved(kernel, index_ctype, count_ctype),
        "saved_doc": wrap(saved_text, 96, "  "),
    }


def _pool_loop_strings(spatial: int, window: int) -> dict:
    """Max pooling's loops over its spatial axes: the padded flags, the window loops' indents, the
    scatter-form backward's table of a window's elements and its windows wholly inside."""
    return {
        "spatial": spatial, "axes": list(range(spatial)), "L": spatial - 1,
        # the flag of a padded element along the last axis, and of a padded row (the outer axes)
        "pad_flag": f"pad{spatial - 1}",
        # each axis's padded flag starts from the previous axis's; a window's loops, indented
        # below the outputs' loops
        "pad_before": [f"pad{a - 1} || " if a else "" for a in range(spatial)],
        "window_indents": ["  " * (a + spatial) for a in range(spatial)],
        # scatter-form backward's table of the window's elements: spatial coordinates and an offset
        "table_width": spatial + 1, "table_size": (spatial + 1) * window,
        "table_last": (spatial + 1) * (window - 1),  # the last element's entry
        # scatter-form backward's windows wholly inside: along dim 0 the band's rows [r0, r1), along
        # the others the input [0, l); and the flag of the dims before (a window inside along all)
        "scatter_inside": [{"start": "r0" if a == 0 else "0", "end": "r1" if a == 0 else f"l{a}",
                            "outer": f"in{a - 1} && " if a else ""} for a in range(spatial)],
    }


def _pool_backward_strings(op: Op, kernel: WindowKernel) -> dict:
    """Max pooling's backward: its form (write, scatter or gather) and words, the band of windows,
    the scatter's accumulators and the step between windows along each dim."""
    sel, g = kernel.selection, kernel.axes
    return {
        # backward where forward saves each window's winner: write where the windows tile the
        # input (each element written once), else scatter (O(outputs) work); under the mask form
        # write where they tile (+0 plus the one window's term: gather's sum), else gather
        "backward_partial": f"cpu/_pool_{_backward_form(sel.form, _tiles(op))}.c.jinja",
        "tiling_doc": "stride = kernel size, no dilation, no padding, floor mode",
        # the write and scatter forms' kernels refuse an index outside the window (return -1)
        "backward_checks_index": repr(sel.form == "scan"),
        "backward_doc": wrap(_BACKWARD_DOCS[_backward_form(sel.form, _tiles(op))], 94, ""),
        "band": _band_windows(g), "scatter": _scatter_accumulators(kernel), "pool_rounding": _pool_rounding(kernel),
        **_pool_b16(kernel), **_pool_f16c(kernel, _tiles(op)),
        # the step between windows along each dim (the coordinate's coefficient of the window)
        "steps": [c_integer_code(sp.diff(g.coordinate, geometry.I), {"s": f"S{a}", "k": f"K{a}", "d": f"D{a}"})
                  for a in range(op.spec.spatial)],
        "scatter_offset": _scatter_offset(g, op.spec.spatial),
    }


def _scatter_offset(g, spatial: int) -> str:
    """Scatter-form backward's offset in memory of a window's winner from the window's start, for
    every window: with one spatial dim its coordinate in window 0 times the stride
    (no table read: a load fewer per window; max_pool1d 16x64x4096 k3 s2 p1's float32 kernel, C
    harness under load: 3.06 -> 2.55 ms), with more the table's last column (offset[local]), where
    the coordinates would be divided out of the row-major local index."""
    if spatial != 1:
        return "offset[local]"
    start = c_integer_code(g.coordinate.subs(geometry.I, 0), {"j": "local", "k": "K0", "s": "S0", "p": "P0", "d": "D0"})
    return f"({start}) * in.s0"


# float16's +0 + v and its kept-or-+0 on the bits: the conversions to float and back of +0 + v leave
# every half but -0 (+0 then) and a NaN (the quiet NaN of its sign, as sg_float_to_half rounds it)
# as it is; the write-form backward of max_pool2d 8x64x112x112 k2 in float16: 8.0 -> 3.2 ms, and
# in 16-bit lanes (masks of uint16_t, not uint32_t: the same bits for every half) 1.07x -> 0.88x PyTorch
_HALF_WRITE = [
    "// float16 on its bits: sg_store_f16((float)0 + sg_load_f16(h)) (+0 for -0, the quiet NaN of its",
    "// sign for a NaN, else h), and h where keep holds, else +0 (no float conversion per element)",
    "SG_INLINE sg_half sg_zero_plus_half(const sg_half h) {  // in 16-bit lanes (vectorized at the half's width)",
    "  const uint16_t nan = (uint16_t)-(uint16_t)((uint16_t)(h & 0x7fffu) > 0x7c00u);",
    "  const uint16_t minus_zero = (uint16_t)-(uint16_t)(h == 0x8000u);",
    "  return (sg_half)(((uint16_t)(0x7e00u | (h & 0x8000u)) & nan) | (h & (uint16_t)~nan & (uint16_t)~minus_zero));",
    "}",
    "SG_INLINE sg_half sg_keep_half(const bool keep, const sg_half h) {",
    "  return (sg_half)(h & (uint16_t)-(uint16_t)keep);",
    "}",
]


def _write_gradient(keep: str) -> dict:
    """The write form's gradient of an element (keep: it is its window's winner) per data type,
    and the helpers it calls."""
    out = {"write_helpers": {}, "write_gradient": {}}
    for name, ctype, acc, *_ in POOL_DTYPES:
        half = ctype != acc
        out["write_helpers"][name] = _HALF_WRITE if name == "f16" else []  # b16's: _B16_HELPERS
        out["write_gradient"][name] = (
            f"sg_keep_b16({keep}, sg_zero_plus_b16(grad_output[o]))" if name == "b16" else
            f"sg_keep_half({keep}, sg_zero_plus_half(grad_output[o]))" if half else
            f"sg_store_{name}(sg_keep_{acc}({keep}, ({acc})0 + sg_load_{name}(grad_output[o])))")
    return out


def _pool_rows(spatial: int, pool: list[dict]) -> dict:
    """The finished strings of the scan form's rows of windows (forward), and of the write and
    scatter forms' loops over the windows (backward), per axis and per data type where they
    depend on them; pool: each axis's pool_axis_code."""
    L = spatial - 1
    outer_pad = f"pad{spatial - 2}" if spatial > 1 else "false"  # the flag of a padded row (the outer axes)
    # scan forward: an element of the row along the last axis, its value where it is padding
    # (per data type) and where it is inside the input (a load with no condition)
    padding = {n: f"sg_store_{n}(({acc})(sg_padding))" for n, _, acc, *_ in C_DTYPES}
    load = f"xw[xrow + i{L} * in.s{L}]"
    return {
        "outer_pad": outer_pad,
        # the edges' element: padded where its row or itself is; its value read under that flag
        "edge_pad": f"{outer_pad} || {pool[L]['outside']}",
        "edge_raw": {n: f"pad ? {padding[n]} : {load}" for n in padding},
        # the windows [jlo, jhi): a padded row (padding taking part), then the row inside the
        # input; each with its block's opening line, its padded flag and its elements' value
        "inside_rows": {n: [{"opening": f"if ({outer_pad}) {{  // a padded row (where padding takes part)",
                             "pad": "true", "raw": padding[n]},
                            {"opening": "} else {  // inside the input: loads with no condition",
                             "pad": "false", "raw": load}] for n in padding},
        # whether an element of the row is the windows' first taking part
        "row_first": f"!started && k{L} == 0",
        # write-form backward: each axis's windows, the band's [w0, w1) along dim 0; the window-local
        # index of a row's first element (the outer axes' k, row-major); the guard of the memset of
        # the rows past the last window along the last axis (the last band's alone along dim 0)
        "write_windows": [{"first": "w0" if a == 0 else "0", "end": "w1" if a == 0 else f"o{a}"}
                          for a in range(spatial)],
        "write_row_local": "".join(f"k{a}" + "".join(f" * K{e}" for e in range(a + 1, spatial)) + " + "
                                   for a in range(L)) + "0",
        "write_tail_guard": "if (band == bands - 1) " if L == 0 else "",
        # write-form backward: an element's gradient, +0 plus grad_output where it is its window's
        # winner, else +0; float16 on its bits (the helpers), with no float conversion per element
        **_write_gradient(f"(int)index[o] == outer + k{L}"),
        # scatter-form backward: each axis's windows, along dim 0 those holding a row of the band
        "scatter_windows": [{"first": "first" if a == 0 else "0", "end": "end" if a == 0 else f"o{a}"}
                            for a in range(spatial)],
    }


def _elementwise_context(art: Artifacts) -> dict:
    """Elementwise ops and expressions: one output element from the inputs' elements at the same
    position (the inputs broadcast together first), its gradients likewise; an input's gradient
    summed back to its shape by the loader (the NumPy module's own sum)."""
    op, kernel = art.op, art.kernel
    assert isinstance(kernel, ElementwiseKernel)
    back_inter, adjoints, grads = backward_plan(kernel, kernel.inputs)
    # the inputs as the .c spells them (an expression's user names them): sg_in_x, sg_grad_x
    names = c_names(kernel.inputs)
    c_grad_names = {names.get(a.name, a.name) for a in kernel.grads}
    def printed(rt: str, suffix: str, half: bool = False) -> dict:
        def lets(assigns):  # (C type, name, code): shared conditions are bool
            return [("bool" if a.boolean else rt, names.get(a.name, a.name), c_code(a.expr, rt, names, half))
                    for a in assigns]
        return {
            "name": rt, "suffix": suffix,  # the compute type, and the functions' name suffix
            "input_params": _params(rt, *(names[n] for n in kernel.inputs)),
            "grad_params": ", ".join(f"{rt}* restrict {names.get(a.name, a.name)}_out" for a in kernel.grads),
            "intermediates": lets(kernel.intermediates),
            "backward_intermediates": lets(back_inter),
            "adjoints": lets(adjoints),
            "output": c_code(kernel.output, rt, names, half),
            # temporaries declared; each gradient assigned to its local, then written out
            "grads": [("" if name in c_grad_names else f"const {ctype} ", name, code)
                      for ctype, name, code in lets(grads)],
            "grad_locals": [names.get(a.name, a.name) for a in kernel.grads],
        }
    real_types = [printed(rt, rt) for rt in C_REAL_TYPES]
    # An op whose NumPy module computes float16 in float16 (no convention, or a preset whose half is
    # "half": NumPy's float16, the constants rounded to float16, each product and sum rounded, and
    # np.maximum's first of equal values) gets float16 functions of their own (suffix half) where
    # that prints differently; the float16 kernels call them.  (Not yet expressions: NumPy rounds
    # each binary operation of their products and sums, and their functions' values.)
    half_fn, half_helpers = "float", []
    half = (printed("float", "half", half=True)
            if not op.half_in_float and not op.spec.strategy.expression else None)
    code = ("intermediates", "backward_intermediates", "adjoints", "output", "grads")
    if half is not None and [half[k] for k in code] != [real_types[0][k] for k in code]:
        real_types.append(half)
        half_fn = "half"
        half_helpers = ["// float16 as the NumPy module computes it: its constants, products and sums rounded",
                        "// to float16, as NumPy's float16 computes them",
                        "SG_INLINE float sg_hround(const float v) { return sg_half_to_float(sg_float_to_half(v)); }",
                        ""]
    # float32 and float64 forward and backward compiled for each SIMD width (SG_SIMD_CLONES: the
    # template's); float16 (a bit conversion per element) and jvp once, for the compile time
    dtypes = [{"name": n, "ctype": c, "acc": a, "load": ld, "store": st, "fn": half_fn if n == "f16" else a,
               "clones": "" if n == "f16" else "SG_SIMD_CLONES "} for n, c, a, ld, st in C_DTYPES]
    wrt = tuple(kernel.wrt or kernel.inputs)
    many = len(kernel.inputs) > 1
    return _base_context(art) | {
        "template": "cpu/elementwise.c.jinja", "loader_template": "cpu/loader_elementwise.py.jinja",
        "inputs": list(kernel.inputs), "inputs_tuple": repr(tuple(kernel.inputs)),
        "c_inputs": [c_identifiers(n) for n in kernel.inputs],
        "real_types": real_types, "half_helpers": half_helpers, "dtypes": dtypes, "broadcast": kernel.broadcast,
        # the branch-free exp and expm1 the printer calls (cpu/_exp.c.jinja), where the op has them
        "exp_helpers": uses_exp([kernel.output, *(a.expr for a in (*kernel.intermediates, *back_inter, *adjoints,
                                                                    *grads))]),
        "torch_sum_to": kernel.broadcast_sum == "torch",  # (conventions.BROADCAST_SUMS)
        # _sum_to_shape's itemsize under the torch sum: the input's (a float16 input's gradient
        # comes from the kernel in float32, PyTorch sums it as float16: host/_torch_sum_to.py.jinja)
        "sum_to_itemsize": ", inputs[k].dtype.itemsize" if kernel.broadcast_sum == "torch" else "",
        # (input, whether backward returns its gradient): an expression's wrt
        "returned_tuple": repr(tuple(k for k, name in enumerate(kernel.inputs) if name in wrt)), "wrt_tuple": repr(wrt),
        "partial": any(name not in wrt for name in kernel.inputs),
        "inputs_text": ", ".join(kernel.inputs), "are": "are" if many else "is",
        "c_inputs_text": ", ".join(c_identifiers(n)["value"] for n in kernel.inputs),
        "c_grads_text": ", ".join(c_identifiers(n)["grad"] for n in kernel.inputs),
        "loader_note": _loader_note(op, "", "the elements", extra=(
            "  A broadcast input's gradient is computed per element of the output by the C kernel "
            "and summed back to the input's shape by the NumPy module's own calls (_sum_to_shape, "
            "block by block as it does): the same sums in the same order, equal bits by "
            "construction." if kernel.broadcast else "")),
    }


# SIMD lanes of 16 bytes (GCC's and Clang's vector extensions: SSE2 and NEON) for the adaptive
# windows' prefilter (_window_lanes): (compute type, its lanes, the integer type of a lane's mask)
_LANES = {"float": (4, "int32_t"), "double": (2, "int64_t")}
# a reduction's row folded in this many bytes of lanes a step: a plain loop over an array of lanes
# that the compiler vectorizes for each SIMD width of the forward's clones (SG_SIMD_CLONES: 2 zmm
# with AVX-512, 4 ymm with AVX2, 8 xmm at the baseline); float16 rows fold one by one
_ROW_LANE_BYTES = 128


def _lane_helpers(kernel: WindowKernel) -> list[str]:
    """The 16-byte lanes' helpers, as finished C lines: a vector of lanes per compute type, a load,
    its max or min, which a NaN does not enter (a NaN is flagged on the side instead: two
    operations a vector where the NaN-propagating fold takes five), a scalar NaN-propagating one."""
    sel = kernel.selection
    fold = MaxOf if sel.extremum == "max" else MinOf
    op = ">" if sel.extremum == "max" else "<"
    helpers = ["// a row's fold in SIMD lanes (vector extensions): the "
               f"{sel.extremum} of each lane (a NaN flagged on the side), then of the lanes"]
    for rt, (lanes, mask) in _LANES.items():  # 16 bytes each
        helpers += [
            f"typedef {rt} sg_{rt}_lanes __attribute__((vector_size(16)));  // {lanes} lanes",
            f"typedef {mask} sg_{rt}_mask __attribute__((vector_size(16)));",
            f"SG_INLINE sg_{rt}_lanes sg_lanes_load_{rt}(const {rt}* p) {{",
            f"  sg_{rt}_lanes v;",
            "  memcpy(&v, p, sizeof v);",
            "  return v;",
            "}",
            f"SG_INLINE sg_{rt}_lanes sg_lanes_{rt}(const sg_{rt}_lanes best, const sg_{rt}_lanes v) {{",
            f"  const sg_{rt}_mask take = v {op} best;  // never a NaN v",
            f"  return (sg_{rt}_lanes)(((sg_{rt}_mask)v & take) | ((sg_{rt}_mask)best & ~take));",
            "}",
            f"SG_INLINE {rt} sg_lane_{rt}(const {rt} best, const {rt} v) {{",
            f"  return {c_code(fold(BEST, V), rt)};",
            "}",
        ]
    return helpers


def _row_lanes(kernel: WindowKernel) -> dict:
    """A mask-form reduction's forward prefilter, as finished C lines per data type: the row folded
    in lanes (an array of _ROW_LANE_BYTES, each lane taking v where v is above it, so a NaN never
    enters: a NaN is flagged on the side; then the lanes and the tail folded the same way, without
    a branch) and the result kept where the order of the fold cannot matter: no element is NaN and
    the extremum is not a zero (so no other element has its value with other bits); else the row's
    own fold follows, element by element (its NaN and zeros rules).  Rows of one step or more;
    float16 rows fold element by element.  The forward of the types folded in lanes is compiled for
    each SIMD width (cpu/_simd_clones.c.jinja)."""
    op = ">" if kernel.selection.extremum == "max" else "<"
    rows = {}
    for name, ctype, acc, *_ in C_DTYPES:
        if acc != ctype:  # float16: loaded one by one
            rows[name] = []
            continue
        step = _LANES[acc][0] * _ROW_LANE_BYTES // 16  # lanes of the compute type
        rows[name] = [
            f"if (n >= {step}) {{  // the fold in {step} lanes, kept where its order cannot matter",
            f"  {acc} lane[{step}];",
            f"  int nan[{step}];  // a NaN seen in the lane (the lanes never take one)",
            f"  for (int j = 0; j < {step}; ++j) {{",
            "    lane[j] = x[base + j];",
            "    nan[j] = sg_isnan(lane[j]);",
            "  }",
            f"  I k = {step};",
            f"  for (; k + {step} <= n; k += {step})",
            f"    for (int j = 0; j < {step}; ++j) {{",
            f"      const {acc} v = x[base + k + j];",
            f"      lane[j] = v {op} lane[j] ? v : lane[j];",
            "      nan[j] |= sg_isnan(v);",
            "    }",
            f"  {acc} fold = lane[0];",
            "  int flagged = nan[0];",
            f"  for (int j = 1; j < {step}; ++j) {{",
            f"    fold = lane[j] {op} fold ? lane[j] : fold;",
            "    flagged |= nan[j];",
            "  }",
            "  for (; k < n; ++k) {",
            f"    const {acc} v = x[base + k];",
            f"    fold = v {op} fold ? v : fold;",
            "    flagged |= sg_isnan(v);",
            "  }",
            "  if (!flagged && fold != 0) {  // no NaN in the row; the extremum's bits its own",
            f"    out[t] = sg_store_{name}(fold);",
            "    continue;",
            "  }",
            "}",
        ]
    # amax over dim -1 of 4096x4096 float32, the kernel alone, 3.06 -> 2.72 ms (NaN flagged on the
    # side) -> 2.42 ms (clones; a loaded machine); four 16-byte vectors of lanes -> 128 bytes of
    # lanes (4 ymm with AVX2, 2 zmm with AVX-512) and the lanes folded without a branch: the kernel
    # alone 1.04 -> 0.96 of PyTorch's amax one thread (one process, load ~4.7)
    clones = {name: "SG_SIMD_CLONES " for name, lines in rows.items() if lines}
    return {"lane_helpers": [], "row_lanes": rows, "forward_clones": clones}


def _column_counts(kernel: WindowKernel) -> dict:
    """The column kernels' counting of each column's hits, where the weight shares a window's
    gradient among its hits (Selection.counts), as finished C lines per data type, and the count
    argument of sg_weight."""
    counts = kernel.selection.counts
    return {"count_arg": ", count[r]" if counts else "", "counting": {name: [
        "I found[SG_COLUMNS];  // counted exactly",
        "for (I r = 0; r < w; ++r) found[r] = 0;",
        "for (I q = 0; q < Q; ++q)",
        f"  for (I r = 0; r < w; ++r) found[r] += sg_hit_{acc}(sg_load_{name}(s[q * R + r]), e[r]) ? 1 : 0;",
        f"{acc} count[SG_COLUMNS];  // as the row kernels convert it, once per column",
        f"for (I r = 0; r < w; ++r) count[r] = ({acc})found[r];",
    ] if counts else [] for name, _, acc, *_ in C_DTYPES}}


def _reduction_context(art: Artifacts) -> dict:
    """Reductions (amax, amin, max, min): each reduced slice a row of n elements, one thread a row;
    the NumPy module's Saved and checks (its partial's macros), the kernels' saved index widened to
    int64 and narrowed back to the NumPy module's type by the loader."""
    op, kernel = art.op, art.kernel
    assert isinstance(kernel, WindowKernel) and kernel.windows == "rows"
    sel = kernel.selection
    selection_doc, real_types = _selection(kernel, sel.combine)  # the fold under the preset's zeros rule
    scan = sel.form == "scan"
    if scan:
        saved_text = ("Saved state: forward saves the winner's position in its row, in the smallest "
                      "unsigned type holding n (the loader narrows the kernel's int64); backward reads "
                      "only it and grad_output (x is not kept).")
    else:
        saved_text = ("Saved state: backward recomputes from x and the output (both kept by reference) "
                      "which elements attain each row's extremum"
                      + (", and counts them." if sel.counts else "."))
    arrays = [("index", _C_INTEGER_TYPES[kernel.runtime_saved_dtype])] if scan else [("x", "T"), ("output", "T")]
    return _base_context(art) | _select_parts(kernel, {
        # a fold alone (no winner; a reduction's forward saves no count) runs in SIMD lanes first:
        # amax over dim -1 of 4096x4096 float32 6.0 -> 3.3 ms (the kernel alone, one thread)
        **({} if scan else _row_lanes(kernel)),
        # the mask form's kernels on a block of reduced dims with others after it, as it lies
        # (select.c.jinja's _select_reduction)
        "columns": None if scan else _column_counts(kernel),
        "loader_geometry_partial": "cpu/_loader_reduction.py.jinja",
        "numpy_partial": f"host/_reduction_{sel.form}.py.jinja",
        **host_partials(kernel),
        **_selection_parts(kernel, "the tangent of each slice's winner",
                           "each slice's weights applied to the tangent, summed in row order"),
        "layouts": [{"name": "", "cl": "false", "suffix": ""}],  # rows, made contiguous by the loader
        "sizes": "const I rows, const I n, const int threads", "sizes_doc": "int64 rows, int64 n, int threads",
        "outputs": "rows",
        "oi": "    ", "wi": "      ", "local": "k", "index_cast": "",
        # an element's gradient is its row's one term, written (not added to a zero); a scan's
        # winner gets grad_output as it is (the NumPy module's put_along_axis)
        "grad_start": "0", "grad_start_comment": "its row's term is written", "gather": "=",
        "accumulate_partial": f"cpu/_gather_{'written' if scan else 'sum'}.c.jinja",
        # every element is in one row: each row writes its elements (its grad_output, extremum and
        # hits read once; the gather form, one element a step, measured 30% slower in float16)
        **_SELECT_BACKWARD["write"],
        # jvp's sum starts from its first term, as NumPy's cumsum (a -0 first term stays -0)
        "jvp_sum": "k ? sum + w : w", "jvp_sum_doc": "from the first term, as NumPy's cumsum (a -0 first term stays -0)",
        "window_order": "row order", "threads_over": "the reduced slices (the rows)",
        # jvp under TANGENT_SUMS "torch": the NumPy module's terms and sum in at::sum's order,
        # placed in the loader (the two backends add in one order)
        "numpy_hit": numpy_code(sel.hit, select=True) if sel.form == "mask" else "",
        # (np.where for a select: the loader has no _select)
        "tangent_term": numpy_code(kernel.tangent_term) if kernel.tangent_term is not None else "",
        # the term reads the element itself (nanmax/nanmin's 'fill'): its parameter and argument
        "term_element": {"param": ", v", "arg": ", v"} if kernel.tangent_term is not None and V in
        kernel.tangent_term.free_symbols else {"param": "", "arg": ""},
        **({"jvp_doc": TORCH_TANGENT_SUM_DOC} if kernel.tangent_term is not None else {}),
        "typedefs": [],
        "saved": _signatures(arrays if scan else [], arrays),
        "selection_doc": selection_doc, "real_types": real_types,
        "saved_doc": wrap(saved_text, 96, "  "),
        # what backward and jvp pass the kernels from saved: the index as int64, or x as rows and the output
        "reads": ("np.ascontiguousarray(saved.index.reshape(rows), dtype=np.int64)" if scan else
                  "_rows(saved.x, dims, kept, n), np.ascontiguousarray(saved.output).reshape(rows)"),
        "loader_note": _loader_note(op, "", "the reduced slices"),
    })


def _maxout_context(art: Artifacts) -> dict:
    """Maxout: windows of `pieces` consecutive channels of an (N, C, S) tensor (S the dims after C
    as one), NCS or channels-last; an element's one window is its channel group."""
    op, kernel = art.op, art.kernel
    assert isinstance(kernel, WindowKernel) and kernel.windows == "blocks"
    sel = kernel.selection
    selection_doc, real_types = _selection(kernel, sel.combine)
    count_dtype = kernel.count_dtype or ""
    index_ctype = _C_INTEGER_TYPES[kernel.index_dtype] if kernel.index_dtype else ""
    count_ctype = _C_INTEGER_TYPES[count_dtype] if count_dtype else ""
    if sel.form == "scan":
        saved_text = (f"Saved state: forward saves the winner's window-local index, one "
                      f"{kernel.index_dtype} per output; backward reads only it and grad_output "
                      f"(x is not kept).")
        values = "index, "
    else:
        saved_text = ("Saved state: backward recomputes from x and the output (both kept by "
                      "reference) which elements attain each window's extremum"
                      + (f"; forward also saves their number, one {count_dtype} per output."
                         if sel.counts else "."))
        values = ("x3.reshape(x.shape), out.reshape(out_shape), "
                  + ("count.reshape(out_shape), " if sel.counts else ""))
    names = {"i": "g", "j": "k", "k": "PIECES", "x": "ch", "length": "c"}
    g = kernel.axes
    saved = _saved(kernel, index_ctype, count_ctype)
    out_shape = "(n, c // PIECES, s)" if sel.form == "scan" else "output_shape"  # a saved output-shaped array's
    return _base_context(art) | _select_parts(kernel, {
        "loader_geometry_partial": "cpu/_loader_maxout.py.jinja",
        "layouts": _layouts(),
        "sizes": "const I n, const I c, const I s, const int threads",
        "sizes_doc": "int64 n, int64 c, int64 s, int threads",
        "outputs": "n * groups * s",
        "oi": "      ", "wi": "        ",  # the loops' bodies: an output's, its window's channels
        "local": "k", "index_cast": "(index_t)",
        "jvp_sum": "sum + w", "jvp_sum_doc": "from +0, in channel order",
        "window_order": "channel order", "threads_over": "the elements",
        "selection_doc": selection_doc, "real_types": real_types,
        **_selection_parts(kernel, "the tangent of each window's winner",
                           "each window's weights applied to the tangent"),
        "pieces": op.params["pieces"],
        # the forward of float32/float64 compiled for each SIMD width (cpu/_simd_clones.c.jinja): its
        # loop over the outputs vectorizes in 2 lanes of the int64 winner at the baseline; 32x256x16x16
        # float32, pieces 4, the kernel alone: 1.79 -> 1.27 ms, PyTorch's amax 1.51 ms (a loaded machine)
        "forward_clones": {name: "SG_SIMD_CLONES " for name in ("f32", "f64")},
        # an element's gradient starts from +0 or -0 (WindowKernel.grad_start); its window's term is
        # added, or (one winner, disjoint windows: grad_start "written") written
        "grad_start": "-0.0" if kernel.grad_start == "-0" else "0",
        "gather": "=" if kernel.grad_start == "written" else "+=",
        # every element is in one window (its channel group): each window writes its channels
        **_SELECT_BACKWARD["write"],
        "grad_start_comment": grad_start_comment(kernel.grad_start),
        "typedefs": _typedefs(index_ctype, count_ctype),
        "dtype_constants": dtype_constants(kernel),
        "saved": saved, "saved_values": values,
        # the loader's checks of the saved arrays: (field, the shape it must have, dtype, bound)
        "saved_arrays": [(field, {"in": "shape", "out": out_shape}[shape], dtype, bound)
                         for field, shape, dtype, bound in saved["arrays"]],
        "saved_shapes_doc": ("the index is (N, C / PIECES, S) as the NumPy module's, S the product of the "
                             "dims after C" if sel.form == "scan" else "x and the output have their own shapes"),
        "saved_doc": wrap(saved_text, 96, "  "),
        "loader_note": _loader_note(op, "; NC... or channels-last, other strides are copied", "the elements"),
    } | dict(maxout={"groups": c_integer_code(g.output_size, names), "start": c_integer_code(g.start, names)}))


def _unpool_context(art: Artifacts) -> dict:
    """Max unpooling (1d/2d/3d): each plane's elements scattered to their slots in row-major
    order, one thread a plane (no atomics); the NumPy module's Saved and checks."""
    kernel = art.kernel
    assert isinstance(kernel, UnpoolKernel)
    return _base_context(art) | {
        "template": "cpu/unpool.c.jinja", "loader_template": "cpu/loader_unpool.py.jinja",
        "spatial": kernel.spatial, "keep": kernel.keep, "each_writer": repr(kernel.each_writer),
        **host_partials(kernel),
        # the parts of the .c and the loader for each writer or the one that stays (its wins saved)
        "c_writers_partial": f"cpu/_unpool_{'each' if kernel.each_writer else 'one'}.jinja",
        # forward's first pass: whether writer i takes its slot over (the last stays: every one does)
        "stays": {"last": "true", "first": "owner[slot] < 0"}[kernel.keep],
        # (every writer getting its gradient, no wins saved) forward's one pass: the writers in the
        # order that writes the one that stays last
        "writers_order": {"last": "for (I i = 0; i < n; ++i)", "first": "for (I i = n; i-- > 0;)"}[kernel.keep],
        # the kernels check the indices' range (the loader's _check_state leaves it to them)
        "indices_range_guard": "not KERNELS_CHECK_RANGE and ",
        "loader_note": _loader_note(art.op, "", "the planes"),
    }


def _adaptive_context(art: Artifacts) -> dict:
    """Adaptive max pooling (1d/2d/3d): PyTorch's windows (symgrad.geometry.ADAPTIVE), which may
    overlap and differ in size, over NCHW or channels-last planes; the NumPy module's Saved and
    checks (a scan's winner as its index in the window box, in the smallest unsigned type)."""
    op, kernel = art.op, art.kernel
    assert isinstance(kernel, WindowKernel) and kernel.windows == "spans"
    sel = kernel.selection
    spatial = op.spec.spatial
    selection_doc, real_types = _selection(kernel, sel.combine)
    scan = sel.form == "scan"
    # backward of a scan scatters, one plane a thread: O(outputs) work, where the gather form's
    # every element finds its holders (8x64x56x56 -> 7x7: 30 ms against PyTorch's 1 ms); gather
    # where an element's start depends on its position (grad_start "slices") or its windows' terms
    # are added last window first (grad_order "reversed"; the scatter adds in window order)
    scatter = scan and kernel.grad_start != "slices" and kernel.grad_order != "reversed"
    return _base_context(art) | _select_parts(kernel, {
        **(_SELECT_BACKWARD["scatter"] if scatter else {}),
        **_adaptive_holder_strings(kernel, spatial),
        **_window_lanes(kernel, spatial),
        "loader_geometry_partial": "cpu/_loader_adaptive.py.jinja",
        "numpy_partial": f"host/_adaptive_{sel.form}.py.jinja",
        **host_partials(kernel),
        "layouts": _layouts(),
        "selection_doc": selection_doc, "real_types": real_types,
        **_selection_parts(kernel, "the tangent of each window's winner",
                           "each window's weights applied to the tangent, summed in row-major order"),
        **_adaptive_loop_strings(spatial),
        "gather": "+=", "jvp_sum": "sum + w",
        "jvp_sum_doc": "from +0, in the window's row-major order, as the NumPy module adds them",
        "window_order": "row-major order",
        "threads_over": "the elements (backward: the planes)" if scatter else "the elements",
        # backward's loader checks each winner against its window, except where the scatter does
        "loader_checks_windows": repr(not scatter),
        "box_note": ", in which a winner is saved as its row-major index (int64, narrowed by the loader)" if scan else "",
        "grad_start": _adaptive_grad_start(kernel, spatial),
        "grad_start_comment": grad_start_comment(kernel.grad_start),
        **_adaptive_saved_strings(kernel),
        "windows_text": ADAPTIVE.doc(),
        "c_window_start": c_integer_code(ADAPTIVE.start), "c_window_end": c_integer_code(ADAPTIVE.end),
        **adaptive_window_code(),  # the loader's Python (the NumPy module's _axis)
        "loader_note": _loader_note(op, "; NCHW or channels-last, other strides are copied", "the elements"),
    })


def _window_lanes(kernel: WindowKernel, spatial: int) -> dict:
    """A scan's forward prefilter for adaptive windows whose rows (along the last axis) are
    contiguous and at least a vector long, as finished C lines: the window's extremum folded in
    SIMD lanes (16-byte lanes: _lane_helpers; two chains, the rows alternating between
    them), kept where the order of the fold cannot matter (neither NaN, so no element is NaN, nor
    a zero, so the value names its bits); the winner is then the first element equal to it in
    row-major order, or the last where a tie goes to the later element (sg_take of the value with
    itself), found by a search that stops there.  Else the window's own scan follows.  float16
    windows scan element by element."""
    if kernel.selection.form != "scan":
        return {}
    axes, last = range(spatial), spatial - 1
    first = " + ".join(f"s{a} * in.s{a}" for a in axes)  # the window's first element's offset
    outer = " + ".join(f"i{a} * in.s{a}" for a in axes[:-1]) or "0"  # a row's, from its window's
    rowlocal = "0"  # a row's first element's row-major index in the window box
    for a in axes[:-1]:
        rowlocal = f"({rowlocal} + (i{a} - s{a})) * k{a + 1}" if a else f"(i0 - s0) * k1"
    width = f"e{last} - s{last}"

    def rows(order: str, body: list[str]) -> list[str]:  # the window's rows, in row-major order or reversed
        heads = [f"for (I i{a} = s{a}; i{a} < e{a}; ++i{a})" if order == "first" else
                 f"for (I i{a} = e{a} - 1; i{a} >= s{a}; --i{a})" for a in axes[:-1]]
        lines = ["  " * a + head for a, head in enumerate(heads)]
        ind = "  " * last
        return lines + [f"{ind}{{", *[f"{ind}  {line}" for line in body], f"{ind}}}"]

    def search(order: str) -> list[str]:  # the first (last) element equal to the extremum, then found
        loop = (f"for (I k = 0; k < {width}; ++k)" if order == "first" else f"for (I k = {width} - 1; k >= 0; --k)")
        return rows(order, [f"const I at = {outer} + s{last};",
                            f"{loop} {{",
                            "  if (x[base + at + k] == fold) {",
                            f"    winner = {rowlocal} + k;",
                            "    winner_at = at + k;",
                            "    goto found;",
                            "  }",
                            "}"])

    lines = {}
    for name, ctype, acc, *_ in C_DTYPES:
        if acc != ctype:
            lines[name] = []
            continue
        lanes = _LANES[acc][0]
        fold = rows("first", [
            f"const {acc}* restrict row = x + base + {outer} + s{last};",
            "I k = 0;",
            f"for (; k + {2 * lanes} <= {width}; k += {2 * lanes}) {{  // two vectors: two chains",
            f"  sg_{acc}_lanes v[2];",
            "  memcpy(v, row + k, sizeof v);",
            f"  lane = sg_lanes_{acc}(lane, v[0]);",
            f"  other = sg_lanes_{acc}(other, v[1]);",
            "  nan |= (v[0] != v[0]) | (v[1] != v[1]);",
            "}",
            f"for (; k + {lanes} <= {width}; k += {lanes}) {{",
            f"  sg_{acc}_lanes v;",
            "  memcpy(&v, row + k, sizeof v);",
            f"  lane = sg_lanes_{acc}(lane, v);",
            "  nan |= v != v;",
            "}",
            f"for (; k < {width}; ++k) fold = sg_lane_{acc}(fold, row[k]);",
            f"const sg_{acc}_lanes swap = lane;  // the next row's vectors: the other chain first",
            "lane = other;",
            "other = swap;"])
        lines[name] = [
            f"if (in.s{last} == 1 && {width} >= {lanes}) {{  // the window's extremum in lanes, kept where its order cannot matter",
            f"  {acc} fold = x[base + {first}];",
            f"  sg_{acc}_lanes lane, other;",
            f"  sg_{acc}_mask nan = {{0}};  // a NaN among the vectors, flagged on the side (sg_lanes never takes one)",
            f"  for (int j = 0; j < {lanes}; ++j) lane[j] = other[j] = fold;",
            *["  " + line for line in fold],
            f"  lane = sg_lanes_{acc}(lane, other);",
            f"  for (int j = 0; j < {lanes}; ++j) fold = sg_lane_{acc}(fold, lane[j]);",
            "  bool flagged = false;",
            f"  for (int j = 0; j < {lanes}; ++j) flagged |= nan[j] != 0;",
            "  if (!flagged && fold != 0 && !sg_isnan(fold)) {  // no NaN in the window, and the extremum's bits are its own",
            "    I winner = 0, winner_at = 0;",
            f"    if (sg_take_{acc}(fold, fold)) {{  // a tie goes to the later element: the last equal to it",
            *["      " + line for line in search("last")],
            "    } else {  // the first equal to it",
            *["      " + line for line in search("first")],
            "    }",
            "  found:",
            "    out[t] = x[base + winner_at];",
            "    index[t] = winner;",
            "    continue;",
            "  }",
            "}",
        ]
    return {"window_lanes": lines, "lane_helpers": _lane_helpers(kernel)}


def _adaptive_holder_strings(kernel: WindowKernel, spatial: int) -> dict:
    """Adaptive pooling's gather-form backward: the windows holding an element along each axis
    (w<a>), in row-major order, or reversed (WindowKernel.grad_order: the last window's term
    added first), as the bounds and the loops over them."""
    axes = range(spatial)
    if kernel.grad_order == "reversed":
        holder_bounds = [f"const I w{a}_first = sg_window_start(i{a}, l{a}, o{a});  // the windows holding "
                         f"i{a}: from here, last first" for a in axes]
        holder_loops = [f"for (I w{a} = sg_window_end(i{a}, l{a}, o{a}); w{a}-- > w{a}_first;)" for a in axes]
    else:
        holder_bounds = [f"const I w{a}_end = sg_window_end(i{a}, l{a}, o{a});  // the windows holding i{a}: "
                         f"up to here" for a in axes]
        holder_loops = [f"for (I w{a} = sg_window_start(i{a}, l{a}, o{a}); w{a} < w{a}_end; ++w{a})" for a in axes]
    return {"holder_bounds": holder_bounds, "holder_loops": holder_loops}


def _adaptive_loop_strings(spatial: int) -> dict:
    """Adaptive pooling's sizes (the kernels' parameters and their docs), dims, the loop bodies'
    indents and an element's window-local index (its row-major index in its window's box)."""
    axes = range(spatial)
    box_index = "(i0 - s0)"  # an element's row-major index in its window's box
    for a in range(1, spatial):
        box_index = f"{box_index if a == 1 else f'({box_index})'} * k{a} + (i{a} - s{a})"
    return {
        "spatial": spatial, "axes": list(axes),
        "param_comment": "  # None: that output size is the input's",  # the output_size parameter
        "sizes": _params("I", "n", "c", *(f"{v}{a}" for v in "lok" for a in axes)) + ", const int threads",
        "sizes_doc": ", ".join(["int64 n", "int64 c", *(f"int64 {v}{a}" for v in "lok" for a in axes), "int threads"]),
        "outputs": " * ".join(["n", "c", *(f"o{a}" for a in axes)]),
        "lengths": "".join(f", l{a}" for a in axes), "outs": "".join(f", o{a}" for a in axes),
        "input_dims": ", ".join(f"l{a}" for a in axes), "output_dims": ", ".join(f"o{a}" for a in axes),
        "box_sizes": ", ".join(f"k{a}" for a in axes),
        # scatter-form backward's table of the window box: its cells, the innermost loop's indent
        # (the tables: a box's cells, their offsets and coordinates, spatial + 1 of them a cell)
        "box_cells": " * ".join(f"k{a}" for a in axes), "box_cell_indent": "  " * spatial,
        "box_tables": str(spatial + 1),
        # the window's and the holders' loop bodies are indented by one level an axis
        "oi": "    ", "wi": "    " + "  " * spatial, "ei": "    ", "hi": "    " + "  " * spatial,
        "si": "    " + "  " * spatial,  # scatter-form backward: a plane's output's body
        # an element's window-local index: its row-major index in its window's box (the element
        # i<a> in the window starting at s<a>, in the window loop and in a holder alike)
        "local": box_index, "holder_local": box_index, "index_cast": "",
    }


def _adaptive_grad_start(kernel: WindowKernel, spatial: int) -> str:
    """An element's gradient's start in C: under "slices", -0 where an element is held by every
    window of every axis."""
    if kernel.grad_start == "slices":
        inside = " && ".join(f"o{a} > 0 && sg_window_start(i{a}, l{a}, o{a}) == 0 && "
                             f"sg_window_end(i{a}, l{a}, o{a}) == o{a}" for a in range(spatial))
        return f"({inside}) ? -0.0 : 0"
    return "-0.0" if kernel.grad_start == "-0" else "0"


def _adaptive_saved_strings(kernel: WindowKernel) -> dict:
    """What adaptive pooling saves: a scan's winner as its index in the window box (int64 in the
    kernels, narrowed by the loader), or x and the output; the kernels' saved parameters and the
    loader's words on them."""
    sel = kernel.selection
    scan = sel.form == "scan"
    if scan:
        saved_text = ("Saved state: forward saves each winner's row-major index in its window's box (the "
                      "largest window extent along each axis), which the loader stores in the smallest "
                      "unsigned type holding it (the kernels write and read int64); backward reads only "
                      "it and grad_output (x is not kept).")
    else:
        saved_text = ("Saved state: backward recomputes from x and the output (both kept by reference) "
                      "which elements attain each window's extremum" + (", and counts them per window."
                                                                         if sel.counts else "."))
    arrays = ([("index", _C_INTEGER_TYPES[kernel.runtime_saved_dtype])] if scan else [("x", "T"), ("output", "T")])
    return {"typedefs": [], "saved": _signatures(arrays if scan else [], arrays),
            "saved_doc": wrap(saved_text, 96, "  ")}


def _fractional_context(art: Artifacts) -> dict:
    """Fractional max pooling (2d/3d): windows of kernel_size at per-plane starts, which the loader
    computes from the samples with the NumPy module's own code (its _windows: floating point, so
    the same windows by construction) and hands the kernels as int64; one thread a plane."""
    op, kernel = art.op, art.kernel
    assert isinstance(kernel, WindowKernel) and kernel.windows == "sampled"
    sel = kernel.selection
    spatial = op.spec.spatial
    selection_doc, real_types = _selection(kernel, sel.combine)
    scan = sel.form == "scan"
    return _base_context(art) | _select_parts(kernel, {
        "loader_geometry_partial": "cpu/_loader_fractional.py.jinja",
        "numpy_partial": f"host/_fractional_{sel.form}.py.jinja",
        **host_partials(kernel),
        "layouts": [{"name": "", "cl": "false", "suffix": ""}],  # x read as contiguous planes
        **_fractional_loop_strings(spatial),
        "gather": "+=", "jvp_sum": "sum + w", "jvp_sum_doc": "from +0, in the window's row-major order",
        "window_order": "row-major order", "threads_over": "the planes",
        # backward scatters: a plane's windows overlap and a scan's gradient goes to one element of
        # each, O(outputs) work (the gather form, every element visiting its holders, measured 8x
        # slower on 48x48 planes, kernel 3, 20x20 outputs)
        **_SELECT_BACKWARD["scatter"],
        "grad_start": "-0.0" if kernel.grad_start == "-0" else "0",
        "grad_start_comment": grad_start_comment(kernel.grad_start),
        "selection_doc": selection_doc, "real_types": real_types,
        **_selection_parts(kernel, "the tangent of each window's winner",
                           "each window's weights summed over its elements in row-major order"),
        "backward_doc": "its winner" if scan else "its elements by their weights",
        "spatial": spatial, "axes": list(range(spatial)), "scan": scan,
        "window": kernel.window, "kernel_size": list(op.params["kernel_size"]),
        **_fractional_saved_strings(kernel),
        "loader_note": _loader_note(op, "; x is read as NCHW, other memory orders are copied", "the planes"),
        **python_geometry(kernel),
    } | fractional_window_code(kernel) | _fractional_starts_code(kernel))


def _fractional_starts_code(kernel: WindowKernel) -> dict:
    """The starts kernel's formulas (the NumPy module's _starts) in each compute type, for the
    block of one axis (l, o, k: its length, outputs and window; u its sample; i a window)."""
    names = {"length": "l", "out": "o"}
    return {"sample_axis": list(kernel.sample_of), "c_starts": {acc: {f: c_real_geometry_code(getattr(kernel.axes, f), acc, names | {"i": f"({acc})i"})
                               for f in ("alpha", "start", "last_start")} for acc in ("float", "double")}}


def _fractional_loop_strings(spatial: int) -> dict:
    """Fractional pooling's per-plane starts and sizes (the kernels' parameters and their docs),
    positions in a plane, the loop bodies' indents, an element's window-local index and jvp's
    winner offsets."""
    axes = range(spatial)

    def rowmajor(names: str, sizes: str) -> str:  # a flat row-major position from coordinates
        return " + ".join(f"{names}{a}" + "".join(f" * {sizes}{b}" for b in axes if b > a) for a in axes)

    local = f"(j0 - s0)"  # an element's row-major index in its window (j<a> in the window from s<a>)
    for a in range(1, spatial):
        local = f"{local if a == 1 else f'({local})'} * K{a} + (j{a} - s{a})"
    return {
        "geometry_params": "".join(f"const int64_t* restrict starts{a}, " for a in axes),
        "starts_doc": "".join(f"const int64* starts{a}, " for a in axes),
        "starts_out_params": "".join(f"int64_t* restrict starts{a}, " for a in axes),
        "starts_out_doc": "".join(f"int64* starts{a}, " for a in axes),
        "sizes": _params("I", "planes", *(f"{v}{a}" for v in "lo" for a in axes)) + ", const int threads",
        "sizes_doc": ", ".join(["int64 planes", *(f"int64 {v}{a}" for v in "lo" for a in axes), "int threads"]),
        "outputs": "planes * out_size",
        "plane_size": " * ".join(f"l{a}" for a in axes), "out_size": " * ".join(f"o{a}" for a in axes),
        "input_dims": ", ".join(f"l{a}" for a in axes), "output_dims": ", ".join(f"o{a}" for a in axes),
        # an element's position in its plane, and a holder's in the output's plane
        "plane_at": rowmajor("j", "l"), "plane_q": rowmajor("q", "o"), "window_at": rowmajor("s", "l"),
        # the loops' bodies: an output's below its axes' loops, a window's element below those
        "oi": "    " + "  " * spatial, "wi": "    " + "  " * (2 * spatial), "si": "    " + "  " * spatial,
        "local": local, "index_cast": "(index_t)",
        # jvp: the winner's offset in its window along each axis, from what is left of its
        # row-major index (local, divided by the later axes' K as the loop goes outward)
        "winner_along": ["local" if a == 0 else f"local % K{a}" for a in axes],
    }


def _fractional_saved_strings(kernel: WindowKernel) -> dict:
    """What fractional pooling saves: a scan's winner as its row-major index in its window (one
    index_dtype per output), or x and the output; and the samples.  The saved parameters, what
    backward and jvp pass the kernels and the loader's words on it."""
    sel = kernel.selection
    scan = sel.form == "scan"
    index_ctype = _C_INTEGER_TYPES[kernel.index_dtype] if scan else ""
    if scan:
        saved_text = (f"Saved state: forward saves each winner's row-major index in its window, one "
                      f"{kernel.index_dtype} per output, and the samples; backward reads only them and "
                      f"grad_output (x is not kept).")
    else:
        saved_text = ("Saved state: backward recomputes from x and the output (both kept by reference) "
                      "which elements attain each window's extremum" + (" and counts them" if sel.counts
                                                                         else "") + "; and the samples.")
    arrays = [("index", "index_t")] if scan else [("x", "T"), ("output", "T")]
    return {
        "index_dtype": kernel.index_dtype or "", "typedefs": _typedefs(index_ctype, ""),
        "saved": _signatures(arrays if scan else [], arrays),
        # what backward and jvp pass the kernels from saved
        "reads": ", ".join(f"np.ascontiguousarray(saved.{name})" for name, _ in arrays),
        "saved_doc": wrap(saved_text, 96, "  "),
    }


def _logsumexp_context(art: Artifacts) -> dict:
    """logsumexp: where NumPy decides the bits, the loader runs the NumPy module's arithmetic
    (np.exp, np.log and np.sum's pairwise order, which the system's libm and a loop in C do not
    equal bit for bit); the C kernels compute the rest, in the NumPy module's order: each slice's
    max and shift and the argument of exp, forward's (v - shift) / t and backward's (v - y) / t,
    one thread a row.  float16 computes in float32, as the NumPy module (its rows are float32)."""
    from ...lower import LogSumExpKernel
    kernel, t = art.kernel, art.op.params["temperature"]
    assert isinstance(kernel, LogSumExpKernel)
    arg = sp.Symbol("arg", real=True)
    (forward_exp,) = kernel.term.atoms(sp.exp)  # exp(the forward's argument)
    (backward_exp,) = kernel.weight.atoms(sp.exp)  # exp(backward's argument)
    real_types = [{"name": {"float": "f32", "double": "f64"}[rt], "type": rt,
                   "shift": c_code(kernel.shift, rt),
                   "forward_arg": c_code(forward_exp.args[0], rt),
                   "backward_arg": c_code(backward_exp.args[0], rt),
                   "lanes": _LANES[rt][0], "mask": _LANES[rt][1]} for rt in C_REAL_TYPES]  # a row's max in lanes
    return _base_context(art) | {
        "template": "cpu/logsumexp.c.jinja", "loader_template": "cpu/loader_logsumexp.py.jinja",
        "rows_doc_end": " (the NumPy module's rows, in its memory order)",
        "empty_slices": True,  # an empty slice is -inf, as torch.logsumexp (the NumPy module's layout)
        "lse_half_partial": lse_half_partial(kernel),  # (where bfloat16_kernels: half names a framework)
        "real_types": real_types,
        # the NumPy module's expressions: in full (a layout the kernels do not take), and with the
        # argument of exp computed by the kernels (arg)
        "shift": numpy_code(kernel.shift), "forward_arg": numpy_code(forward_exp.args[0]),
        "backward_arg": numpy_code(backward_exp.args[0]),
        "term_of_arg": numpy_code(kernel.term.xreplace({forward_exp.args[0]: arg})),
        "output": numpy_code(kernel.output),
        "weight_of_arg": numpy_code(kernel.weight.xreplace({backward_exp.args[0]: arg})),
        "formula": (f"{t!r} * log(sum(exp(x / {t!r})))" if t != 1 else "log(sum(exp(x)))"),
        "weight_text": f"exp((x - y) / {t!r})" if t != 1 else "exp(x - y)",
        "loader_note": _loader_note(op=art.op, layout="", over="the reduced slices", extra=(
            "  np.exp, np.log and np.sum are NumPy's (the loader runs the NumPy module's "
            "arithmetic where NumPy decides the bits: its SIMD exp and log differ from the C "
            "library's, its sum is pairwise); the kernels compute each slice's max and shift and "
            "the arguments of exp.")),
    }


def _segment_context(art: Artifacts) -> dict:
    """Segments (scatter_max, segment_max): cpu/segment.py."""
    from .segment import segment_context
    base = _base_context(art) | {"loader_note": _loader_note(art.op, "", "the elements (backward; forward and jvp are serial)")}
    # the fold: the kernel's where the segment's NaN output is its last (lower.SegmentRule.nan_last:
    # the max that keeps the last NaN), else the NaN-propagating max/min (its first NaN)
    combine = art.kernel.selection.combine if art.kernel.segment.nan_last else None
    return segment_context(art, base, _selection(art.kernel, combine), base["dtypes"])


def _bag_context(art: Artifacts) -> dict:
    """Bags (embedding_bag_max, roi_max_pool): cpu/bag.py."""
    from .bag import bag_context
    base = _base_context(art) | {"loader_note": _loader_note(art.op, "", "the bags (forward) and the columns")}
    return bag_context(art, base, _selection(art.kernel), base["dtypes"])


def _order_context(art: Artifacts) -> dict:
    """Order statistics (sort, topk, cummax, cummin, kthvalue, median, nanmedian): cpu/order.py."""
    from .order import order_context
    return order_context(art, _base_context(art) | {"loader_note": _loader_note(art.op, "", "the rows")})


# the context function of each kernel form this backend builds (lower.kernel_form)
_CONTEXTS = {"ElementwiseKernel": _elementwise_context, "UnpoolKernel": _unpool_context,
             "LogSumExpKernel": _logsumexp_context, "strided": _pool_context, "rows": _reduction_context,
             "blocks": _maxout_context, "spans": _adaptive_context, "sampled": _fractional_context,
             "segments": _segment_context, "OrderKernel": _order_context, "bags": _bag_context}
FORMS = tuple(_CONTEXTS)  # the kernel forms this backend builds (lower.kernel_form; the others follow)


def context(art: Artifacts) -> dict:
    """The template context of an op's .c source and loader (finished strings only), from the
    context function of its kernel's form; the file names of its two templates among them."""
    check_form(art.op)
    return _CONTEXTS[kernel_form(art.kernel)](art)


def _bfloat16_refused(art: Artifacts) -> dict:
    """Where the NumPy module computes a whole-bfloat16 op's forward, backward or jvp in bfloat16
    (as the framework of its preset), the compiled kernels do not (they compute float16, float32
    and float64 only): those calls raise a TypeError that names the NumPy backend."""
    kernels = bfloat16_kernels(art)
    what = ("each add of a window's gradient rounded" if isinstance(art.kernel, WindowKernel)
            else "each constant, product and sum rounded")
    return {"bfloat16_kernels": {k: v if v.startswith("_float_") else "_bfloat16_refused" for k, v in kernels.items()},
            "bfloat16_refusal": f"bfloat16 arrays under this preset are computed in bfloat16 ({what}, as the "
                                f"framework) by the NumPy backend only: load it with backend='numpy', or pass float32"}


def _input_variables(names: list) -> dict:
    """forward's parameter for each input (input_vars; input_pairs: (name, parameter)): its name,
    but _input_threads for an input named threads, the loaders' own keyword (no input name starts
    with _, so the parameter is no other input's), so that any valid input name works."""
    params = [f"_input_{name}" if name == "threads" else name for name in names]
    return {"input_vars": params, "input_pairs": list(zip(names, params))}


def render(art: Artifacts) -> dict[str, str]:
    """{file name: file text}: the C source and the loader of an op (its bfloat16 wrappers the
    NumPy module's, from the same context)."""
    ctx = {"b16": None} | context(art) | bfloat16_context(art) | {"bfloat16_refusal": ""}
    ctx |= _input_variables(ctx["input_names"]) | preamble_context(ctx["header_py"], ctx["loader_note"], LOADER_IMPORTS)
    ctx |= NUMPY_ARRAYS
    if computes_bfloat16(art):  # the NumPy module computes (some of) bfloat16 in bfloat16: refused
        ctx.update(_bfloat16_refused(art))
    if ctx["b16"] and ctx["bfloat16_kernels"]:  # max pooling's bfloat16 adds: its b16 kernels
        ctx["bfloat16_kernels"] = ctx["bfloat16_kernels"] | {"backward": "_backward_b16"}
    env = _environment()
    source, loader = file_names(art.op)
    return {source: env.get_template(ctx["template"]).render(**ctx),
            loader: env.get_template(ctx["loader_template"]).render(**ctx)}
