"""The CPU backend: each op's kernel printed by ``printer.CPrinter`` into a C source (``templates/``:
OpenMP threads over planes, backward in write, scatter or gather form, float16 computed in float)
and a small Python
loader with the NumPy module's interface, which compiles the .c with the system C compiler on
first use, keeps the shared library beside the cached module (named by its source's hash) and
calls it through ctypes on NumPy arrays.

The pool kind (max_pool1d/2d/3d) is built so far; other kinds are refused with a ValueError
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
from ...indicators import MaxOf, MinOf
from ...lower import BEST, COUNT, EXTREMUM, GRAD_OUTPUT, HIT, V, WindowKernel, smallest_index_dtype
from ...ops import Op
from ..common import docstring, header, python_geometry, wrap
from ..printing import pool_axis_code, python_integer_code
from .printer import C_REAL_TYPES, c_code, c_integer_code

if TYPE_CHECKING:  # the pipeline hands its Artifacts to the backends, which need not import it
    from ...pipeline import Artifacts

KINDS = ("pool",)  # the op kinds this backend builds (the others follow)
# the compiler's flags, stated in the .c header and used by the loader: no -ffast-math and no FMA
# contraction, so every operation rounds as NumPy's; no -march=native (the library stays portable)
CFLAGS = ("-O3", "-std=c11", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
# (name in kernel names, storage type, compute type, load, store): float16 as its bits, computed in float
C_DTYPES = (("f16", "sg_half", "float", "sg_half_to_float(v)", "sg_float_to_half(v)"),
            ("f32", "float", "float", "v", "v"),
            ("f64", "double", "double", "v", "v"))
C_LAYOUTS = (("nchw", "false"), ("nhwc", "true"))  # channels-last: cl = true
_C_UNSIGNED = {"uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t"}


_threads_ran_in: int | None = None  # the process whose kernels ran OpenMP threads (one libgomp for all)


def fork_safe_threads(threads: int) -> int:
    """The thread count for a kernel call (0: OpenMP's default): 1 in a process forked after its
    parent's kernels ran OpenMP threads, since GNU libgomp's thread pool does not survive fork()
    (a parallel region of several threads there waits forever for threads the child does not
    have; one thread runs without the pool); else threads, noting the process when it asks for
    more than one.  Every loader calls it, so the note covers every op's library."""
    global _threads_ran_in
    pid = os.getpid()
    if _threads_ran_in is not None and _threads_ran_in != pid:
        return 1
    if threads != 1:
        _threads_ran_in = pid
    return threads


def source_name(op: Op) -> str:
    """The C source of an op: <module>.c."""
    return naming.module_name(op) + ".c"


def loader_name(op: Op) -> str:
    """The loader of an op: <module>_cpu.py (apart from the NumPy module's name)."""
    return naming.module_name(op) + "_cpu.py"


def file_names(op: Op) -> tuple[str, ...]:
    """The C source and the loader (imported last)."""
    return (source_name(op), loader_name(op))


def check_kind(op: Op) -> None:
    """A ValueError naming the kinds there are, for an op this backend does not build yet."""
    if op.spec.kind not in KINDS:
        raise ValueError(f"the cpu backend builds the {', '.join(KINDS)} kind only so far "
                         f"({op.name} is of kind {op.spec.kind!r}); use backend='numpy' for it")


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    """This package's templates as ``cpu/<file>``; the NumPy backend's (``numpy/``), the CUDA
    backend's (``cuda/``: its loaders' layout helpers) and the shared Python pieces (``common/``)
    are included from where they are, not copied."""
    root = Path(__file__).resolve().parent.parent
    loaders = {"cpu": jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
               "numpy": jinja2.FileSystemLoader(str(root / "numpy" / "templates")),
               "cuda": jinja2.FileSystemLoader(str(root / "cuda" / "templates")),
               "common": jinja2.FileSystemLoader(str(root / "templates"))}
    return jinja2.Environment(loader=jinja2.PrefixLoader(loaders), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              autoescape=False)


def _params(real_type: str, *names) -> str:
    return ", ".join(f"const {real_type} {n}" for n in names)


def _selection(kernel: WindowKernel) -> tuple[list, list]:
    """The selection as C functions, once per compute type (a name suffixed by it: C has no
    overloading): (docs, [{name, functions: [{ret, name, params, body}]}])."""
    sel = kernel.selection
    fold = MaxOf if sel.extremum == "max" else MinOf
    count = [COUNT] if sel.counts else []
    # (doc, return type, name, parameters, expression, prelude)
    functions = [("sg_combine(best, v): the window's extremum so far, NaN propagating",
                  "{rt}", "sg_combine", (BEST, V), fold(BEST, V), ())]
    if sel.form == "scan":
        functions.append(("sg_take(v, best): a later element v takes over from the running winner best",
                          "bool", "sg_take", (V, BEST), sel.take, ()))
    else:
        functions += [
            ("sg_hit(v, extremum): an element attains its window's extremum",
             "bool", "sg_hit", (V, EXTREMUM), sel.hit, ()),
            (f"sg_weight(grad_output, v, extremum{', count' if sel.counts else ''}): the gradient of "
             f"element v of a window", "{rt}", "sg_weight", (GRAD_OUTPUT, V, EXTREMUM, *count), sel.weight,
             (f"const bool {HIT} = sg_hit_{{rt}}(v, extremum);",))]
    real_types = [{"name": rt, "functions": [
        {"ret": ret.format(rt=rt), "name": f"{name}_{rt}", "params": _params(rt, *map(str, params)),
         "body": [*(line.format(rt=rt) for line in prelude), f"return {c_code(expr, rt)};"]}
        for _, ret, name, params, expr, prelude in functions]} for rt in C_REAL_TYPES]
    return [f[0] for f in functions], real_types


def _saved(kernel: WindowKernel, index_ctype: str, count_ctype: str) -> dict:
    """What forward saves and backward and jvp read, as the kernels' finished parameter lists (per
    data type) and arguments, and the loader's Saved fields and arrays."""
    sel = kernel.selection
    scan = sel.form == "scan"
    counted = [("count", count_ctype)] if sel.counts else []
    writes = [("index", index_ctype)] if scan else counted
    reads = [("index", index_ctype)] if scan else [("x", "T"), ("output", "T")] + counted

    def params(arrays, const, ctype):
        return "".join(f"{const}{ctype if c == 'T' else c}* restrict {name}, " for name, c in arrays)

    def doc(arrays, const):
        return "".join(f"{const}{c}* {name}, " for name, c in arrays)

    return {
        "writes_doc": doc(writes, ""), "reads_doc": doc(reads, "const "),
        "writes": {dt: params(writes, "", ct) for dt, ct, *_ in C_DTYPES},
        "reads": {dt: params(reads, "const ", ct) for dt, ct, *_ in C_DTYPES},
        "writes_args": "".join(f"{name}, " for name, _ in writes),
        "reads_args": "".join(f"{name}, " for name, _ in reads),
        # sg_weight's count argument, at an output position o (backward) or t (jvp)
        "count_at": {rt: (f", ({rt})count[o]" if sel.counts else "") for rt in C_REAL_TYPES},
        "count_at_t": {rt: (f", ({rt})count[t]" if sel.counts else "") for rt in C_REAL_TYPES},
        # the loader: Saved's array fields, what forward allocates (field, dtype constant), and
        # each saved array's (field, "in" or "out" shape, dtype, bound of its values)
        "fields": [name for name, _ in reads],
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
              "written once, its window's gradient where it is the winner, else +0 (no zeroing pass)."),
    "scatter": ("backward is in scatter form: a band of input rows is zeroed, then each window "
                "holding one of its rows adds its gradient to its winner, in output order "
                "(no atomic operation: each band is one thread's)."),
    "gather": ("backward is in gather form: each input element visits the windows holding it "
               "(no atomic operation, no zeroing pass)."),
}


def _tiles(op: Op) -> bool:
    """The windows tile the input: along every dim, adjacent (stride = kernel size, no dilation),
    none reaching outside it (no padding, floor mode); only the rest past the last window is in
    no window."""
    p = op.params
    return (not p.get("ceil_mode", False) and all(pd == 0 for pd in p["padding"])
            and all(d == 1 for d in p["dilation"]) and tuple(p["stride"]) == tuple(p["kernel_size"]))


def _scatter_accumulators() -> dict:
    """Scatter-form backward's sums, per data type: in grad_x itself where the compute type is the
    storage type, else (float16) in a float scratch band per thread, rounded once into grad_x."""
    out = {}
    for name, ctype, acc, *_ in C_DTYPES:
        apart = ctype != acc
        out[name] = {
            "doc": (f"{name}: the sums in a {acc} scratch band per thread, each rounded once into grad_x."
                    if apart else f"{name}: the sums are made in grad_x itself."),
            "accumulator": "scratch" if apart else "region",
            "store": ([f"for (I e = 0; e < size; ++e) region[e] = sg_store_{name}(acc[e]);  // rounded once"]
                      if apart else []),
            "alloc": (f"({acc}*)malloc(sizeof({acc}) * (size_t)(((l0 + bands - 1) / bands) * s0 + 1))"
                      if apart else "NULL"),
            "missing": "scratch == NULL" if apart else "false",
        }
    return out


def context(art: Artifacts) -> dict:
    """The template context of an op's .c source and loader: finished strings only."""
    op, kernel = art.op, art.kernel
    check_kind(op)
    assert isinstance(kernel, WindowKernel) and kernel.geometry == "pool"
    sel = kernel.selection
    spatial = op.spec.spatial
    selection_doc, real_types = _selection(kernel)
    count_dtype = smallest_index_dtype(kernel.window + 1) if sel.counts else ""
    index_ctype = _C_UNSIGNED[kernel.index_dtype] if kernel.index_dtype else ""
    count_ctype = _C_UNSIGNED[count_dtype] if count_dtype else ""
    if sel.form == "scan":
        saved_text = (f"Saved state: forward saves the winner's window-local index, one "
                      f"{kernel.index_dtype} per output; backward reads only it and grad_output "
                      f"(x is not kept).")
    else:
        saved_text = ("Saved state: backward recomputes from x and the output (both kept by "
                      "reference) which elements attain each window's extremum"
                      + (f"; forward also saves their number, one {count_dtype} per output."
                         if sel.counts else "."))
    g = kernel.axes
    g_names = {"i": "np.arange(out)[:, None]", "j": "np.arange(k)"}
    lines = header(op, "cpu")
    return {
        "header_py": lines, "header": ["//" + line[1:] for line in lines],
        "docstring": docstring(op, art.derivation, kernel),
        "op": op.name, "ties": op.ties, "params": repr(op.params),
        "inputs_tuple": repr(tuple(op.spec.inputs)), "piecewise_linear": art.piecewise_linear,
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "prefix": naming.module_name(op), "source_name": source_name(op), "loader_name": loader_name(op),
        "cflags": " ".join(CFLAGS), "cflags_tuple": repr(CFLAGS),
        "dtypes": [{"name": n, "ctype": c, "acc": a, "load": ld, "store": st} for n, c, a, ld, st in C_DTYPES],
        "layouts": [{"name": n, "cl": cl} for n, cl in C_LAYOUTS],
        "selection_doc": selection_doc, "real_types": real_types,
        "selection_partial": f"cpu/_pool_{sel.form}.c.jinja",
        # backward where forward saves each window's winner: write where the windows tile the
        # input (each element written once), else scatter (O(outputs) work); else gather
        "backward_partial": (f"cpu/_pool_{'write' if _tiles(op) else 'scatter'}.c.jinja" if sel.form == "scan"
                             else "cpu/_pool_gather.c.jinja"),
        "tiling_doc": "stride = kernel size, no dilation, no padding, floor mode",
        "backward_doc": wrap(_BACKWARD_DOCS["gather" if sel.form != "scan" else "write" if _tiles(op) else "scatter"], 94, ""),
        "band": _band_windows(g), "scatter": _scatter_accumulators(),
        # the step between windows along each dim (the coordinate's coefficient of the window)
        "steps": [c_integer_code(sp.diff(g.coordinate, geometry.I), {"s": f"S{a}", "k": f"K{a}", "d": f"D{a}"})
                  for a in range(spatial)],
        "form": sel.form, "counts": sel.counts, "window": kernel.window,
        "padding_takes_part": "true" if kernel.padding_takes_part else "false",
        "padding_comment": ("padding takes part, as -inf (a gradient it wins is dropped)"
                            if kernel.padding_takes_part else "padding never wins"),
        "padding_value": "-sg_inf_f()" if sel.extremum == "max" else "sg_inf_f()",
        "winner_is_output": "true" if sel.winner_is_output else "false",
        "winner_comment": ("the winner's value is the output" if sel.winner_is_output else
                           "the output is the fold of the window (NaN propagating), not the winner's "
                           "value: under this NaN rule a window holding NaN can have a number as its winner"),
        "index_ctype": index_ctype, "count_ctype": count_ctype,
        "dtype_constants": (
            [f"INDEX_DTYPE = np.{kernel.index_dtype}  # the winner's window-local index, saved per output"]
            if sel.form == "scan" else []) + (
            [f"COUNT_DTYPE = np.{count_dtype}  # the number of elements attaining the extremum, saved per output"]
            if sel.counts else []),
        "saved": _saved(kernel, index_ctype, count_ctype),
        "saved_doc": wrap(saved_text, 96, "  "),
        "spatial": spatial, "axes": list(range(spatial)),
        "kernel_size": list(op.params["kernel_size"]), "stride": list(op.params["stride"]),
        "padding": list(op.params["padding"]), "dilation": list(op.params["dilation"]),
        "pool": [pool_axis_code(g, a, c_integer_code) for a in range(spatial)],
        "inner": _inner_rows(g, spatial - 1),
        "loader_coordinates": python_integer_code(g.coordinate, g_names),
        "loader_inside": python_integer_code(g.inside, {"x": "position", "length": "L"}),
        "loader_note": wrap(
            f"CPU backend: forward, backward and jvp take and return NumPy arrays (float16, float32, "
            f"float64; NCHW or channels-last, other strides are copied) and run the C kernels of "
            f"{source_name(op)}, compiled with the system C compiler on first use (flags: "
            f"{' '.join(CFLAGS)}) and kept beside this module, named by the source's hash.  "
            f"threads: OpenMP threads over the planes (default: THREADS, else OpenMP's default; 1 in a "
            f"process forked after OpenMP threads ran, where libgomp's threads are gone); "
            f"results do not depend on it.", indent=""),
        **python_geometry(kernel),
    }


def render(art: Artifacts) -> dict[str, str]:
    """{file name: file text}: the C source and the loader of an op."""
    ctx = context(art)
    env = _environment()
    source, loader = file_names(art.op)
    return {source: env.get_template("cpu/pool.c.jinja").render(**ctx),
            loader: env.get_template("cpu/loader.py.jinja").render(**ctx)}
