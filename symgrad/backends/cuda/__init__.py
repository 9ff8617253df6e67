"""The CUDA backend: each op's kernel printed by printer.CudaPrinter, once per compute type, into
a .cu source (templates/) and a CuPy loader with the NumPy module's interface."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import sympy as sp

from ... import naming
from ...geometry import ADAPTIVE
from ...indicators import MaxOf
from ...lower import (BEST, COUNT, EXTREMUM, GRAD_OUTPUT, HIT, M_SHIFT, MAX_VALUE, SUM, V, Y, ElementwiseKernel, UnpoolKernel, WindowKernel, kernel_form,
                     backward_plan, beats_start, skips_nan)
from ..cfamily import padding_strings
from ..cfamily.naming import c_identifiers, c_names
from ..common import (docstring, environment, grad_start_comment, header, order_docstring, python_geometry,
                      special_docstring, wrap)
from ..host import CUPY_ARRAYS, dtype_constants, preamble_context
from ..printing import pool_axis_code, python_integer_code
from .logsumexp import half_context
from .printer import CUDA_REAL_TYPES, cuda_code, cuda_integer_code

if TYPE_CHECKING:  # annotations only: the lowering makes the Artifacts a backend reads
    from ...ops import Op
    from ...lower import Artifacts


def source_name(op: Op) -> str:
    """The CUDA kernel source of an op: <module>.cu."""
    return naming.module_name(op) + ".cu"


def loader_name(op: Op) -> str:
    """The CuPy loader of an op: <module>_cuda.py (apart from the NumPy module's name)."""
    return naming.module_name(op) + "_cuda.py"


def namespace(op: Op) -> str:
    """The C++ namespace that holds an op's device code (several .cu files can share a unit)."""
    return "sg_" + naming.module_name(op)


def kernel_pattern(op: Op) -> str:
    """extern "C" kernel names: <module>_<role>_<dtype>[_<layout>][_<index type>]."""
    return naming.module_name(op) + "_{role}"


def file_names(op: Op) -> tuple[str, ...]:
    """The kernels' source and the loader (imported last)."""
    return (source_name(op), loader_name(op))


CUDA_BLOCK = 256  # threads a block in the loader's launches
# (name in kernel names, C type of the storage): computed in float, float, float, double
CUDA_DTYPES = (("f16", "sg_half"), ("bf16", "sg_bfloat16"), ("f32", "float"), ("f64", "double"))
CUDA_INDEX_TYPES = (("i32", "int"), ("i64", "long long"))
CUDA_LAYOUTS = (("nchw", "false"), ("nhwc", "true"))  # channels-last: CL = true
# the loader's standard-library imports
LOADER_IMPORTS = ("import threading", "from pathlib import Path")
_C_INTEGER_TYPES = {"uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
                    "uint64": "unsigned long long", "int64": "long long"}


# what jvp does with a window, in the kernels' and the loaders' docs, by the lowered form (a scan's
# winner or a mask's weights): {windows' form: {site: {form: words}}}
_EACH_WINDOW = {"scan": "the tangent of each window's winner",
                "mask": "each window's weights applied to the tangent"}
_FORM_DOCS = {
    "strided": {"loader_jvp": _EACH_WINDOW,
             "kernel_jvp": {"scan": "the tangent of its window's winner",
                            "mask": "its window's weights applied to the tangent, summed in window order"}},
    "spans": {"loader_jvp": _EACH_WINDOW,
                 "kernel_jvp": {"scan": "the tangent of its window's winner",
                                "mask": "its window's weights applied to the tangent, summed in row-major order"}},
    "sampled": {"loader_jvp": _EACH_WINDOW,
                   "kernel_jvp": {"scan": "the tangent of its window's winner",
                                  "mask": "its window's weights applied to the tangent, summed in row-major order"}},
    "blocks": {"loader_jvp": _EACH_WINDOW,
               "kernel_jvp": {"scan": "the tangent of its window's winner",
                              "mask": "its window's weights applied to the tangent, summed in channel order"}},
    "rows": {"loader_jvp": {"scan": "the tangent of each slice's winner",
                                 "mask": "each slice's weights applied to the tangent, summed in row order"}},
}


def _params(real_type: str, *names) -> str:
    return ", ".join(f"const {real_type} {n}" for n in names)


@dataclass(frozen=True)
class _CFunction:
    """One selection function: printed per compute type as `prelude; return result;`."""

    doc: str
    returns: str  # a C type, "{rt}" for the compute type
    name: str
    params: tuple  # symbols, each a parameter of the compute type
    result: sp.Basic
    prelude: tuple[str, ...] = ()


def _cuda_window(op: Op, kernel: WindowKernel) -> dict:
    """What every window kernel's .cu and loader get from the lowered selection: its C functions
    per compute type, the words on it, and what forward saves (static or run-time windows)."""
    sel = kernel.selection
    functions = _selection_functions(kernel)
    real_types = []
    for rt in CUDA_REAL_TYPES:
        real_types.append({"name": rt, "functions": [
            {"ret": f.returns.format(rt=rt), "name": f.name, "params": _params(rt, *map(str, f.params)),
             "body": [*f.prelude, f"return {cuda_code(f.result, rt)};"]} for f in functions]})
    ctx = {"real_types": real_types,
           "form_doc": {site: words[sel.form] for site, words in _FORM_DOCS[kernel.windows].items()},
           # the mask form's lines that count each window's hits, where the weight shares the gradient
           "count_partial": "cuda/_count.cu.jinja" if sel.counts else "cuda/_no_count.cu.jinja",
           "selection_doc": [f.doc for f in functions],
           **_window_words(kernel)}
    winner = f"constexpr bool WINNER_IS_OUTPUT = {ctx['winner_is_output']};  // {ctx['winner_comment']}"
    if kernel.static_windows:
        ctx.update(_static_saved(kernel, winner))
    else:
        ctx.update(_runtime_saved(op, kernel, winner))
    return ctx


def _selection_functions(kernel: WindowKernel) -> list[_CFunction]:
    """The selection as C functions, printed once per compute type: (doc, return type, name,
    parameters, body) with every expression from the lowered kernel."""
    sel = kernel.selection
    count = [COUNT] if sel.counts else []
    functions = [_CFunction("sg_combine(best, v): the window's extremum so far, NaN propagating",
                            "{rt}", "sg_combine", (BEST, V), sel.combine)]
    if sel.form == "scan":
        functions.append(_CFunction("sg_take(v, best): a later element v takes over from the "
                                    "running winner best", "bool", "sg_take", (V, BEST), sel.take))
    else:
        functions += [
            _CFunction("sg_hit(v, extremum): an element attains its window's extremum",
                       "bool", "sg_hit", (V, EXTREMUM), sel.hit),
            _CFunction(f"sg_weight(grad_output, v, extremum{', count' if sel.counts else ''}): the "
                       f"gradient of element v of a window", "{rt}", "sg_weight",
                       (GRAD_OUTPUT, V, EXTREMUM, *count), sel.weight,
                       (f"const bool {HIT} = sg_hit(v, extremum);",))]
        if kernel.tangent_term is not None:  # conventions.TANGENT_SUMS "torch": jvp divides once
            functions.append(_CFunction("sg_term(grad_output, v, extremum): element v's term of jvp's "
                                        "sum, which is divided by the count once", "{rt}", "sg_term",
                                        (GRAD_OUTPUT, V, EXTREMUM), kernel.tangent_term,
                                        (f"const bool {HIT} = sg_hit(v, extremum);",)))
    return functions


def _window_words(kernel: WindowKernel) -> dict:
    """The kernels' words and small strings from the lowered window kernel: jvp's sum, the padding,
    the gradient's start and how a term lands, the winner's relation to the output."""
    sel = kernel.selection
    return {
        # reductions' jvp: the weights added up, or (TANGENT_SUMS "torch") the terms added up in
        # row order (not at::sum's: the NumPy and cpu backends' order) and divided once
        "tangent_term": kernel.tangent_term is not None,
        "jvp_out": "sum / (acc)count[r]" if kernel.tangent_term is not None else "sum",
        **padding_strings(kernel),
        # an element's gradient starts from +0 or -0 (WindowKernel.grad_start)
        "grad_start": "-(acc)0" if kernel.grad_start == "-0" else "0",
        # a window's term lands on the element's gradient: added, or (disjoint windows, the
        # winner's gradient grad_output itself, WindowKernel.grad_start "written") written
        "gather": "=" if kernel.grad_start == "written" else "+=",
        "grad_start_comment": grad_start_comment(kernel.grad_start),
        "winner_is_output": "true" if sel.winner_is_output else "false",
        "winner_comment": ("the winner's value is the output" if sel.winner_is_output else
                           "the output is the fold of the window (NaN propagating), not the "
                           "winner's value: under this NaN rule a window holding NaN can have a "
                           "number as its winner")}


def _static_saved(kernel: WindowKernel, winner: str) -> dict:
    """What forward saves where the windows are known at generation: the index and count types
    (sized by the lowering), the kernels' saved parameters and constants, the loader's dtype
    constants and its words on the saved state.  winner: the scan's WINNER_IS_OUTPUT line."""
    sel = kernel.selection
    count_dtype = kernel.count_dtype or ""
    index_ctype = _C_INTEGER_TYPES[kernel.index_dtype] if kernel.index_dtype else ""
    count_ctype = _C_INTEGER_TYPES[count_dtype] if count_dtype else ""
    if sel.form == "scan":
        size = np.dtype(kernel.index_dtype).itemsize
        saved = [f"Saved state: forward saves the winner's window-local index, one {kernel.index_dtype} "
                 f"({size} byte{'s' if size > 1 else ''}) "
                 f"per output; backward reads only it and grad_output (x is not kept)."]
    else:
        saved = ["Saved state: backward recomputes from x and the output (both kept by reference) "
                 "which elements attain each window's extremum"]
        saved[-1] += (f"; forward also saves their number, one {count_dtype} per output." if sel.counts
                      else ".")
    return {
        "index_ctype": index_ctype, "count_ctype": count_ctype,
        "index_dtype": kernel.index_dtype or "", "count_dtype": count_dtype,
        "saved": _saved_signature(kernel, ("index_t", index_ctype), ("count_t", count_ctype)),
        # the kernels' constants of the selection: the scan's output rule and saved index type, the
        # count's type
        "saved_constants": (
            [winner, f"typedef {index_ctype} index_t;  // saved: the winner's window-local index"]
            if sel.form == "scan" else []) + (
            [f"typedef {count_ctype} count_t;  // saved: the number of elements attaining the extremum"]
            if sel.counts else []),
        "dtype_constants": dtype_constants(kernel),
        "saved_doc": [line for s in saved for line in wrap(s, 96, "  ")]}


def _runtime_saved(op: Op, kernel: WindowKernel, winner: str) -> dict:
    """What forward saves where the windows' size is known only at run time (_RUNTIME_WINDOW): the
    kernels take index and count as long long, which the loader narrows; the saved parameters,
    the words on the index and the loader's words on the saved state."""
    sel = kernel.selection
    window = _RUNTIME_WINDOW.get(kernel.windows)
    wide = _C_INTEGER_TYPES[kernel.runtime_saved_dtype]  # the kernels' type of what the loader narrows
    signature = _saved_signature(kernel, (wide, wide), (wide, wide), window)
    boxes = ", ".join(f"k{a}" for a in range(op.spec.spatial))
    extra = "".join(f", the {p}" for p in kernel.plane_inputs)
    if sel.form == "scan":
        saved = ["Saved state: the winner's position in its row, in the smallest unsigned type holding "
                 "n (the loader picks it at run time; the backward kernel takes it as long long)."]
    else:
        saved = ["Saved state: backward recomputes from x (as rows) and the output, both kept, "
                 "which elements attain each row's extremum"]
        saved[-1] += ("; forward also saves their number per row (the smallest unsigned type holding n; "
                      "the backward kernel takes it as long long)." if sel.counts else ".")
    return {
        "index_ctype": "", "count_ctype": "", "index_dtype": "", "count_dtype": "",
        "saved": signature,
        "saved_constants": [winner] if sel.form == "scan" else [],
        "saved_index_doc": [] if sel.form != "scan" else {
            "sampled": ["A winner is saved as its row-major index in its window."],
            "spans": [f"{boxes}: the window box, the largest window extent along each axis; a winner is "
                      f"saved as", "its row-major index in its window's box."]}.get(kernel.windows, []),
        "saved_class_doc": wrap(f'    """What forward keeps: {signature["keeps"]}{extra}; its layout, and shapes."""',
                                100, "    "),
        "saved_doc": [line for s in saved for line in wrap(s, 96, "  ")]}


def _saved_signature(kernel: WindowKernel, index: tuple[str, str], count: tuple[str, str],
                     window: tuple[str, str] | None = None) -> dict:
    """What forward saves and backward and jvp read, as finished parameter lists and arguments of
    the kernels: the saved index (scan) or x and the output and maybe the count (mask), from the
    lowered selection.  index, count: (type in the kernel templates, C type in the extern "C"
    wrappers); "T" is the data type of the kernel templates.  window: where the window's size is
    known only at run time (adaptive, fractional), the loader's expression of it in _saved_arrays
    and in forward; the kernels then take index and count as long long, which forward narrows to
    the smallest unsigned type and backward and jvp widen again."""
    sel = kernel.selection
    scan = sel.form == "scan"
    counted = [("count", *count)] if sel.counts else []
    writes = [("index", *index)] if scan else counted
    reads = [("index", *index)] if scan else [("x", "T", "T"), ("output", "T", "T")] + counted

    if window is None:  # static: the dtypes are the loader's constants
        bound = {"index": str(kernel.window), "count": str(kernel.window + 1)}
        dtype = {"index": "INDEX_DTYPE", "count": "COUNT_DTYPE"}
        allocated = dtype
        narrow = {}
    else:
        bound = {"index": window[0], "count": f"{window[0]} + 1"}
        dtype = {name: f"_index_dtype({b})" for name, b in bound.items()}
        allocated = {"index": "np.int64", "count": "np.int64"}
        narrow = {"index": window[1], "count": f"{window[1]} + 1"}

    def params(arrays, const, c_type):
        return "".join(f"{const}{c_type(k, c)}* __restrict__ {name}, " for name, k, c in arrays)

    def doc(arrays, const):
        return "".join(f"{const}{c}* {name}, " for name, _, c in arrays)

    def per_dtype(arrays, const):  # the extern "C" wrappers' parameters, per data type
        return {dt: params(arrays, const, lambda k, c, ct=ct: ct if c == "T" else c) for dt, ct in CUDA_DTYPES}

    return {
        "writes_doc": doc(writes, ""), "reads_doc": doc(reads, "const "),
        # the kernel templates' parameter lines (each ends with a comma)
        "writes": [params(writes, "", lambda k, c: k).rstrip()] if writes else [],
        "reads": [params(reads, "const ", lambda k, c: k).rstrip()],
        "writes_c": per_dtype(writes, ""), "reads_c": per_dtype(reads, "const "),
        "writes_args": "".join(f"{name}, " for name, _, _ in writes),
        "reads_args": "".join(f"{name}, " for name, _, _ in reads),
        # the count argument of sg_weight, read at an output position (none where uncounted)
        "count_at": {at: (f", (acc)count[{at}]" if sel.counts else "") for at in ("o", "t", "r")},
        # the loader: Saved's array fields, what forward allocates (field, dtype constant), what
        # backward and jvp pass, and each saved array's (field, "in" or "out" shape, dtype, bound of
        # its values: the window's elements, or one more for a count)
        "fields": [name for name, _, _ in reads],
        "allocates": [(name, allocated[name]) for name, _, _ in writes],
        "loader_reads": "".join(f"saved.{name}, " for name, _, _ in reads),
        "arrays": ([("index", "out", dtype["index"], bound["index"])] if scan else
                   [("x", "in", "saved.dtype", "None"), ("output", "out", "saved.dtype", "None")]
                   + ([("count", "out", dtype["count"], bound["count"])] if sel.counts else [])),
        # run-time windows: forward narrows what the kernel wrote, backward and jvp widen it
        "narrows": [(name, f"_index_dtype({narrow[name]})") for name, _, _ in writes if name in narrow],
        "widens": [name for name, _, _ in writes if name in narrow],
        "widened_reads": "".join(f"{name}, " if name in narrow else f"saved.{name}, " for name, _, _ in reads),
        "keeps": ("the window-local index of each output's winner" if window is None else
                  "each output's winner as its row-major index in its window"
                  + ("'s box (the largest window extent along each axis)" if window[0] == "size" else "")
                  + ", in the smallest unsigned type holding it") if scan else
                 "the input and the output (by reference)",
    }


def context(art: Artifacts) -> dict:
    """The template context of an op's .cu source and loader: finished strings only."""
    op, kernel = art.op, art.kernel
    if kernel_form(kernel) == "OrderKernel":  # sort, topk, cummax, ...: cuda/order.py
        from .order import order_context
        return order_context(art, _cuda_base_context(op, art.derivation, kernel))
    ctx = _cuda_base_context(op, art.derivation, kernel)
    ctx["piecewise_linear"] = art.piecewise_linear
    if op.spec.strategy.special:
        ctx.update(_special_cuda_context(op, kernel))
        return ctx
    return _cuda_context_rest(op, kernel, ctx)


def _cuda_base_context(op: Op, d, kernel) -> dict:
    return {
        "header": ["//" + line[1:] for line in header(op, "cuda")],
        "docstring": (order_docstring(op, d, kernel) if kernel_form(kernel) == "OrderKernel"
                      else special_docstring(op, d, kernel) if op.spec.strategy.special
                      else docstring(op, d, kernel)),
        "op": op.name,
        "ties": op.ties,
        "params": repr(op.params),
        "inputs_tuple": repr(tuple(op.spec.inputs)),
        "namespace": namespace(op),
        "prefix": naming.module_name(op),
        "kernel_pattern": kernel_pattern(op),
        "source_name": source_name(op),
        "block": CUDA_BLOCK,
        "dtypes": [{"name": n, "ctype": c} for n, c in CUDA_DTYPES],
        "index_types": [{"name": n, "ctype": c} for n, c in CUDA_INDEX_TYPES],
        "layouts": [{"name": n, "cl": c} for n, c in CUDA_LAYOUTS],
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "loader_note": wrap(
            f"CUDA backend: forward and backward take and return CuPy arrays (float16, float32, "
            f"float64, and bfloat16 where CuPy has it) and run the kernels of "
            f"{source_name(op)}, compiled by CuPy on first use.  CuPy is imported "
            f"when it is first needed: pip install cupy-cuda12x (or pip install \".[cuda]\" from symgrad's checkout).", indent=""),
    }


def _cuda_context_rest(op: Op, kernel, ctx: dict) -> dict:
    """An elementwise or window op's .cu and loader context, over the base context (ctx)."""
    if isinstance(kernel, ElementwiseKernel):
        return _cuda_elementwise(op, kernel, ctx)
    assert isinstance(kernel, WindowKernel)
    if kernel.windows == "segments":  # scatter_max, segment_max: cuda/segment.py
        from .segment import segment_context
        return segment_context(op, kernel, ctx)
    return _cuda_window_context(op, kernel, ctx)


def _cuda_elementwise(op: Op, kernel: ElementwiseKernel, ctx: dict) -> dict:
    """An elementwise op (cuda/elementwise.cu.jinja): its functions per compute type, with float16
    and bfloat16 overloads where they print differently, and its inputs as the .cu spells them."""
    printed = _elementwise_printer(kernel)
    real_types = [printed(rt) for rt in CUDA_REAL_TYPES]
    tag_types, tag_arg = _tag_overloads(op, printed, real_types)
    ctx.update(loader_geometry_partial="cuda/_loader_elementwise.py.jinja",
               template="cuda/elementwise.cu.jinja",
               inputs=list(kernel.inputs), inputs_tuple=repr(tuple(kernel.inputs)),
               c_inputs=[c_identifiers(n) for n in kernel.inputs],
               real_types=real_types, tag_types=tag_types, tag_arg=tag_arg, broadcast=kernel.broadcast,
               index_types_doc=True, layouts_doc=False,
               wrt_only=kernel.wrt is not None and tuple(kernel.wrt) != tuple(kernel.inputs),
               wrt_tuple=repr(tuple(kernel.wrt or kernel.inputs)))
    return ctx


def _elementwise_printer(kernel: ElementwiseKernel):
    """printed(rt, half, bf16): an elementwise kernel's functions printed for one compute type
    (float16 or bfloat16 rounding where asked), with the inputs as the .cu spells them (sg_in_x,
    sg_grad_x: an expression's user names them)."""
    back_inter, adjoints, grads = backward_plan(kernel, kernel.inputs)
    names = c_names(kernel.inputs)
    c_grad_names = {names.get(a.name, a.name) for a in kernel.grads}

    def printed(rt, half=False, bf16=False):
        def lets(assigns):  # (C type, name, code): shared conditions are bool
            return [("bool" if a.boolean else rt, names.get(a.name, a.name),
                     cuda_code(a.expr, rt, names, half, bf16)) for a in assigns]
        return {
            "name": rt,
            "input_params": _params(rt, *(names[n] for n in kernel.inputs)),
            "grad_params": ", ".join(f"{rt}& {names.get(a.name, a.name)}" for a in kernel.grads),
            "intermediates": lets(kernel.intermediates),
            "backward_intermediates": lets(back_inter),
            "adjoints": lets(adjoints),
            "output": cuda_code(kernel.output, rt, names, half, bf16),
            # gradients are assigned to the output references, temporaries among them declared
            "grads": [("" if name in c_grad_names else f"const {ctype} ", name, code)
                      for ctype, name, code in lets(grads)],
            "tag_param": "",
        }
    return printed


def _tag_overloads(op: Op, printed, real_types: list) -> tuple[list[str], str]:
    """An op whose NumPy module computes float16 in float16 (no convention, or a preset whose
    half is "half": NumPy's float16 with the constants rounded to float16, np.maximum's first
    of equal values) gets float16 functions of their own where they print differently, and
    under a preset bfloat16 ones as the NumPy module computes bfloat16 there (_output_bf16);
    overloads chosen by a tag type (each 16-bit one derives from the others').  Appends them to
    real_types; returns the tag types' lines and the tag argument."""
    tag_types, tag_arg = [], ""
    variants = []  # (printed functions, storage type, tag, rounding function's lines)
    if not op.half_in_float and not op.spec.strategy.expression:  # (as the cpu backend's)
        variants = [(printed("float", half=True), "sg_half", "sg_half_tag", [
            "// float16 as the NumPy module computes it: its constants, products and sums rounded",
            "// to float16, as NumPy's float16 computes them",
            "__device__ __forceinline__ float sg_hround(const float v) {",
            "  return sg_half_to_float(sg_float_to_half(v));",
            "}"]), (printed("float", bf16=True), "sg_bfloat16", "sg_bfloat16_tag", [
            "// bfloat16 under this preset: its constants, products and sums rounded to bfloat16,",
            "// as the NumPy module computes them (as the framework does)",
            "__device__ __forceinline__ float sg_bround(const float v) {",
            "  return sg_bfloat16_to_float(sg_float_to_bfloat16(v));",
            "}"])][:2 if op.convention else 1]  # bfloat16 without one: widened, rounded once
        variants = [v for v in variants if v[0] != real_types[0]]
    if variants:
        for rt in real_types:
            rt["tag_param"] = ", sg_any_tag"
        tag_arg = ", typename sg_tag_of<T>::type()"
        tag_types = ["struct sg_any_tag {};",
                     "template <typename T> struct sg_tag_of { typedef sg_any_tag type; };"]
        for functions, storage, tag, rounding in variants:
            functions["tag_param"] = f", {tag}"
            real_types.append(functions)
            tag_types += rounding + [f"struct {tag} : sg_any_tag {{}};",
                                     f"template <> struct sg_tag_of<{storage}> {{ typedef {tag} type; }};"]
        tag_types.append("")
    return tag_types, tag_arg


def _cuda_window_context(op: Op, kernel: WindowKernel, ctx: dict) -> dict:
    """A window op: the selection (_cuda_window), the templates of its windows' form
    (_WINDOW_TEMPLATES), the strings of its geometry (_FORM_STRINGS) and, on the
    select-and-gather skeleton, the strings where the geometries differ (_gather_strings)."""
    ctx.update(_cuda_window(op, kernel))
    # the reduction's first kernel needs the compute type where it compares (scan) or counts
    ctx["reduce_types"] = (["typedef typename tr::acc acc;"]
                           if kernel.selection.form == "scan" or kernel.selection.counts else [])
    parts = _WINDOW_TEMPLATES[kernel.windows]
    ctx["loader_geometry_partial"] = parts["loader"]
    if parts["loader_form"]:  # their loaders' scan or mask parts likewise
        ctx["loader_partial"] = parts["loader_form"].format(form=kernel.selection.form)
    # strided, spans, sampled windows and blocks share one select-and-gather skeleton
    # (cuda/gather.cu.jinja): its geometry the partial _gather_<geometry> (window bounds, the
    # windows holding an element), its tensor layout _layout_<layout>, its scan or mask the
    # partial _select_<form>; rows (the reductions' chunked passes) have a template of their own
    gathered = parts["layout"] is not None
    # the selection's partial of the kernel template (its scan or mask bodies), chosen by the form
    ctx["selection_partial"] = parts["selection"].format(form=kernel.selection.form)
    if gathered:
        ctx["layout_partial"] = f"cuda/_layout_{parts['layout']}.cu.jinja"
    ctx["geometry_partial"] = parts["geometry"]
    ctx.update(template=parts["template"],
               window=kernel.window, index_types_doc=gathered, layouts_doc=gathered)
    if kernel.windows in _FORM_STRINGS:
        ctx.update(_FORM_STRINGS[kernel.windows](op, kernel))
    if gathered:
        ctx.update(_gather_strings(op, kernel, ctx))
    ctx.update(python_geometry(kernel))  # the loader's Python
    return ctx


def _strided_strings(op: Op, kernel: WindowKernel) -> dict:
    """Pooling's windows: the parameters per axis, each axis's geometry in C, the padded flags and
    the loader's coordinates and sizes."""
    spatial = op.spec.spatial
    g = kernel.axes
    return dict(spatial=spatial, axes=list(range(spatial)),
                kernel_size=list(op.params["kernel_size"]), stride=list(op.params["stride"]),
                padding=list(op.params["padding"]), dilation=list(op.params["dilation"]),
                pool=[pool_axis_code(kernel.axes, a, cuda_integer_code) for a in range(spatial)],
                # an element is padding along axis a if it is along an earlier axis (the flag
                # pad{a - 1}) or outside the input along a; the innermost flag says it for the element
                pad_inherited=[f"pad{a - 1} || " if a else "" for a in range(spatial)],
                pad_flag=f"pad{spatial - 1}",
                loader_coordinates=python_integer_code(
                    g.coordinate, {"i": "np.arange(out)[:, None]", "j": "np.arange(k)"}),
                loader_inside=python_integer_code(g.inside, {"x": "position", "length": "L"}),
                sizes_head=["def _sizes(shape: tuple):",
                            '    """(batched input shape, output spatial sizes) of an input shape."""'])


def _blocks_strings(op: Op, kernel: WindowKernel) -> dict:
    """Blocks' pieces and their geometry in C (_blocks_code)."""
    return dict(pieces=op.params["pieces"], maxout=_blocks_code(kernel))


def _blocks_code(kernel: WindowKernel) -> dict:
    """Blocks' geometry (groups of PIECES consecutive channels, symgrad.geometry) in C: the groups,
    a window's start, an element's channel, the winner's, an element's holder and its place in it."""
    names = {"i": "g", "j": "k", "k": "PIECES", "x": "ch", "length": "c"}
    g = kernel.axes
    return {"groups": cuda_integer_code(g.output_size, names),
            "start": cuda_integer_code(g.start, names),
            "coordinate": cuda_integer_code(g.coordinate, names),
            "winner": cuda_integer_code(g.coordinate, names | {"j": "(I)index[t]"}),
            "holder": cuda_integer_code(g.holder, names),
            "element": cuda_integer_code(g.element, names)}


# the templates of each form of windows (WindowKernel.windows): the .cu template, its selection
# partial (of the lowered form), its geometry partial, the tensor layout of the select-and-gather
# skeleton ((N, C, L0, ...) with windows along the spatial axes, or (N, C, S) with windows of
# consecutive channels; None: a template of its own), the loader's geometry partial and its scan
# or mask part (None: the loader's geometry partial has both)
_WINDOW_TEMPLATES = {
    "strided": {"template": "cuda/gather.cu.jinja", "selection": "cuda/_select_{form}.cu.jinja",
                "geometry": "cuda/_gather_pool.cu.jinja", "layout": "spatial",
                "loader": "cuda/_loader_pool.py.jinja", "loader_form": None},
    "spans": {"template": "cuda/gather.cu.jinja", "selection": "cuda/_select_{form}.cu.jinja",
              "geometry": "cuda/_gather_adaptive.cu.jinja", "layout": "spatial",
              "loader": "cuda/_loader_adaptive.py.jinja", "loader_form": "cuda/_loader_adaptive_{form}.py.jinja"},
    "sampled": {"template": "cuda/gather.cu.jinja", "selection": "cuda/_select_{form}.cu.jinja",
                "geometry": "cuda/_gather_fractional.cu.jinja", "layout": "spatial",
                "loader": "cuda/_loader_fractional.py.jinja", "loader_form": None},
    "blocks": {"template": "cuda/gather.cu.jinja", "selection": "cuda/_select_{form}.cu.jinja",
               "geometry": "cuda/_gather_maxout.cu.jinja", "layout": "channels",
               "loader": "cuda/_loader_maxout.py.jinja", "loader_form": None},
    "rows": {"template": "cuda/reduction.cu.jinja", "selection": "cuda/_reduction_{form}.cu.jinja",
             "geometry": "cuda/_gather_reduction.cu.jinja", "layout": None,
             "loader": "cuda/_loader_reduction.py.jinja", "loader_form": "cuda/_loader_reduction_{form}.py.jinja"},
}
# where the windows' size is known only at run time: the loader's expression of it in _saved_arrays
# and in forward (_saved_signature's window)
_RUNTIME_WINDOW = {"spans": ("size", "int(np.prod(box))"), "sampled": ("WINDOW", "WINDOW")}


def _holder_loops(kernel: WindowKernel, axes) -> dict:
    """Adaptive pooling's gather backward: the windows holding an element along each axis (w<a>),
    in row-major order, or reversed (WindowKernel.grad_order: the last window's term added first)."""
    if kernel.grad_order == "reversed":
        return {"holder_bounds": [f"const long long w{a}_first = sg_window_start(i{a}, l{a}, o{a});  // windows "
                                  f"holding i{a}: from here, last first" for a in axes],
                "holder_loops": [f"for (long long w{a} = sg_window_end(i{a}, l{a}, o{a}); w{a}-- > w{a}_first;)"
                                 for a in axes]}
    return {"holder_bounds": [f"const long long w{a}_end = sg_window_end(i{a}, l{a}, o{a});  // windows holding "
                              f"i{a}: up to here" for a in axes],
            "holder_loops": [f"for (long long w{a} = sg_window_start(i{a}, l{a}, o{a}); w{a} < w{a}_end; ++w{a})"
                             for a in axes]}


def _gather_strings(op: Op, kernel: WindowKernel, ctx: dict) -> dict:
    """The finished strings cuda/gather.cu.jinja and its selection partials place where the
    geometries differ: an element of a window (its raw value, its compute-type value, the offset
    jvp reads), the winner's window-local index and its test in backward, the tangent of the
    winner, the sizes the kernels take, the types and counters; from the lowered geometry."""
    sel = kernel.selection
    scan = sel.form == "scan"
    static = kernel.static_windows  # saved types sized at generation: index_t, count_t
    count_t = ctx["saved"]["count_at"]["t"]
    if kernel.windows == "blocks":
        strings = _channel_gather_strings(op, kernel, count_t)
    else:
        strings = _spatial_gather_strings(op, kernel, ctx, count_t)
    strings.update(
        # the scan's running winner: window-local, in int where the window is known at generation
        winner_type="int" if static else "long long",
        index_store="(index_t)winner" if static else "winner",
        # the mask's hits of a window, where counted
        hits_type="unsigned int" if static else "long long", hit="1u : 0u" if static else "1 : 0",
        count_store="(count_t)hits" if static else "hits",
        jvp_types=_JVP_SCAN_TYPES[kernel.windows] if scan else ["typedef sg_traits<T> tr;", "typedef typename tr::acc acc;"],
        forward_inputs_doc="".join(f"const T* {p}, " for p in ["x", *strings["plane_inputs"]]) + "T* out, ",
        plane_inputs_doc="".join(f"const T* {p}, " for p in strings["plane_inputs"]))
    return strings


# a scan's jvp kernel's types, by the form of windows (its mask's: the traits and the compute type)
_JVP_SCAN_TYPES = {"blocks": [], "strided": ["typedef sg_traits<T> tr;", "typedef typename tr::acc acc;"],
                   "sampled": ["typedef sg_traits<T> tr;"], "spans": []}


def _channel_gather_strings(op: Op, kernel: WindowKernel, count_t: str) -> dict:
    """_gather_strings of windows of consecutive channels (blocks, layout (N, C, S))."""
    m = _blocks_code(kernel)
    element = f"x[sg_offset<I, CL>(b, {m['coordinate']}, j, c, s)]"
    return {
        "element_raw": element, "element_value": f"tr::load({element})",
        "scan_first_raw": "T()",  # the first element of the window starts the scan
        "winner_local": "k", "winner_test": f"(int)index[o] == (int)({m['element']})",
        "jvp_at": f"const I at = sg_offset<I, CL>(b, {m['coordinate']}, j, c, s);",
        "jvp_term": [f"sum += sg_weight(tr::load(tangent_x[at]), tr::load(x[at]), e{count_t});"],
        "winner_tangent": f"tangent_x[sg_offset<I, CL>(b, {m['winner']}, j, c, s)]",
        "window_depth": 1, "holder_depth": 0,
        "sizes_doc": "I n, I c, I s", "size_params": "const I n, const I c, const I s",
        "size_args": "n, c, s",
        "size_params_c": {n: f"const {c} n, const {c} c, const {c} s" for n, c in CUDA_INDEX_TYPES},
        "threads_doc": {
            "forward": f"n * (c / {op.params['pieces']}) * s threads, one per output element (x: (n, c, s), "
                       f"s the product of the dims after c; out: (n, c / {op.params['pieces']}, s))",
            "backward": "n * c * s threads, one per input element",
            "jvp": f"n * (c / {op.params['pieces']}) * s threads, one per output element"},
        "scan_order": "channel order",
        "gather_doc": ["Gather form: one thread per input element; its one window is channel group ch / PIECES."],
        "plane_inputs": [], "axes": []}


def _spatial_gather_strings(op: Op, kernel: WindowKernel, ctx: dict, count_t: str) -> dict:
    """_gather_strings of windows along the spatial axes (layout (N, C, L0, ...)): the element at
    its offset in the plane, the sizes and offsets (in I where the windows are known at
    generation, else 64-bit), the threads; then pooling's padding or the holders' ranges."""
    static = kernel.static_windows
    spatial = op.spec.spatial
    axes = range(spatial)
    at = " + ".join(f"i{a} * in.s{a}" for a in axes)
    box = list(ctx.get("box_axes", []))
    sizes = ["n", "c", *(f"l{a}" for a in axes), *(f"o{a}" for a in axes), *(f"k{a}" for a in box)]
    long = "I" if static else "long long"  # the kernels' offsets: in I, or 64-bit
    strings = {
        "element_raw": f"xw[{at}]", "element_value": f"tr::load(xw[{at}])",
        "scan_first_raw": "xw[0]",
        "jvp_at": f"const {long} at = base + {at};",
        "jvp_term": [f"sum += sg_weight(tr::load(tangent_x[at]), tr::load(x[at]), e{count_t});"],
        "winner_tangent": f"tangent_x[base + {at}]",
        "window_depth": spatial, "holder_depth": spatial,
        "sizes_doc": ", ".join(f"I {s}" for s in sizes),
        "size_params": ", ".join(f"const I {s}" for s in sizes), "size_args": ", ".join(sizes),
        "size_params_c": {n: ", ".join(f"const {c} {s}" for s in sizes) for n, c in CUDA_INDEX_TYPES},
        "offset_type": long,
        # the offset of an (n, c) plane of the input (in) and of the output (os)
        "plane_in": "b * in.sb + ch * in.sc" if static else "(long long)b * in.sb + (long long)ch * in.sc",
        "plane_out": "b * os.sb + ch * os.sc" if static else "(long long)b * os.sb + (long long)ch * os.sc",
        "threads_doc": {
            "forward": "n * c{} threads, one per output element (x: (n, c{}), out: (n, c{}){})".format(
                "".join(f" * o{a}" for a in axes), "".join(f", l{a}" for a in axes),
                "".join(f", o{a}" for a in axes),
                ", output sizes as PyTorch computes them" if kernel.windows == "strided" else ""),
            "backward": "n * c{} threads, one per input element".format("".join(f" * l{a}" for a in axes)),
            "jvp": "n * c{} threads, one per output element".format("".join(f" * o{a}" for a in axes))},
        "scan_order": "window-local (row-major) order" if kernel.windows == "strided" else "row-major order",
        "plane_inputs": list(kernel.plane_inputs)}
    if kernel.windows == "strided":
        strings.update(_padded_gather_strings(ctx["pad_flag"], at, axes, count_t))
    else:
        strings.update(_holder_gather_strings(kernel, ctx["box_index"], axes))
    return strings


def _padded_gather_strings(pad: str, at: str, axes, count_t: str) -> dict:
    """Pooling's element where padding may take part (pad: the element's padded flag), the
    winner's window-local index from its offsets along the axes, and the words on the order."""
    winner_local = " + ".join(f"k{a}" + "".join(f" * K{b}" for b in axes if b > a) for a in axes)
    return dict(
        element_raw=f"{pad} ? tr::store(sg_padding<acc>()) : xw[{at}]",
        element_value=f"{pad} ? sg_padding<acc>() : tr::load(xw[{at}])",
        winner_local=winner_local,
        jvp_term=[f"sum += {pad} ? sg_weight((acc)0, sg_padding<acc>(), e{count_t})  // padding has tangent 0",
                  f"     : sg_weight(tr::load(tangent_x[at]), tr::load(x[at]), e{count_t});"],
        # the winner may be padding where it takes part: its tangent is 0
        winner_tangent=f"inside ? tangent_x[base + {at}] : tr::store((acc)0)",
        gather_doc=["Gather form: one thread per input element visits every window that holds it, and adds that",
                    "window's gradient where the element is the window's winner.  Windows are visited from the last",
                    "window-local offset to the first, which is the order of the output positions (row-major): the",
                    "sums round as the NumPy backend's, PyTorch's and XLA's do."],
        winner_test=f"(int)index[o] == {winner_local}")


def _holder_gather_strings(kernel: WindowKernel, box_index: str, axes) -> dict:
    """Windows at starts of their own (spans, sampled): the winner's index in its box (box_index),
    the start of each window holding an element and the ranges of its holders."""
    scan = kernel.selection.form == "scan"
    return dict(
        winner_local=box_index, winner_test=f"index[o] == {box_index}",
        # adaptive: where the scan tests a winner, the start of each window holding it
        holder_starts=[[f"const long long s{a} = sg_window_start(w{a}, o{a}, l{a});"] if scan else []
                       for a in axes],
        **_holder_loops(kernel, axes),
        gather_doc=["Gather form: one thread per input element visits the windows that hold it (a contiguous range",
                    "along each axis) in output (row-major) order, and adds each window's gradient where the element",
                    "is its winner: the sums round as the NumPy backend's and PyTorch's do.  No atomics."])


def _box_unravel(spatial: int, size: str) -> dict:
    """A scan's jvp: the winner's row-major index in its window (box), `local`, unravelled from the
    last axis to the first: along axis a the offset in the box (box_local[a]) and the lines that
    then move local to the earlier axes (box_next[a]); the box's sizes are size0, size1, ..."""
    return {"box_local": [f"local % {size}{a}" if a else "local" for a in range(spatial)],
            "box_next": [[f"local /= {size}{a};"] if a else [] for a in range(spatial)]}


def _cuda_fractional(op: Op, kernel: WindowKernel) -> dict:
    """Fractional pooling: windows of kernel_size at per-plane starts from the samples."""
    spatial = op.spec.spatial
    box = _box_unravel(spatial, "K")
    local = "(i0 - s0)"  # an element's row-major index in its window
    for a in range(1, spatial):
        local = f"{local if a == 1 else f'({local})'} * K{a} + (i{a} - s{a})"
    if kernel.selection.form == "scan":
        saved = ("Saved state: forward saves each winner's row-major index in its window, which the "
                 "loader stores in the smallest unsigned type holding it (the kernels read and write "
                 "it as long long), and the samples; backward reads only them and grad_output (x is "
                 "not kept).")
    else:
        saved = ("Saved state: backward recomputes from x and the output (both kept by reference) "
                 "which elements attain each window's extremum"
                 + ("; forward also saves their number per output (the loader stores it in the "
                    "smallest unsigned type holding it; the kernels take it as long long)"
                    if kernel.selection.counts else "") + "; and the samples.")
    names = {"i": "(A)i", "length": "l", "out": "o"}
    g = kernel.axes
    return box | {"spatial": spatial, "axes": list(range(spatial)), "box_index": local,
                  "box_axes": [],  # the windows' sizes are the constants K0, K1, ..., not arguments
            "kernel_size": list(op.params["kernel_size"]),
            "sample_of": list(kernel.sample_of),
            "windows_doc": f"Window starts: {kernel.sampling}.",
            "saved_doc": wrap(saved, 96, "  ")} | dict(
            fractional={f: cuda_integer_code(getattr(g, f), names) for f in ("alpha", "start", "last_start")})


def _cuda_adaptive(op: Op, kernel: WindowKernel) -> dict:
    """Adaptive pooling: window boxes and saved state whose sizes are known only at run time."""
    spatial = op.spec.spatial
    out = _box_unravel(spatial, "k")
    box_index = "(i0 - s0)"  # an element's row-major index in its window's box
    for a in range(1, spatial):
        box_index = f"{box_index if a == 1 else f'({box_index})'} * k{a} + (i{a} - s{a})"
    sel = kernel.selection
    if sel.form == "scan":
        saved = ("Saved state: forward saves each winner's row-major index in its window's box (the "
                 "largest window extent along each axis), which the loader stores in the smallest "
                 "unsigned type holding it (the kernels read and write it as long long); backward "
                 "reads only it and grad_output (x is not kept).")
    else:
        saved = ("Saved state: backward recomputes from x and the output (both kept by reference) "
                 "which elements attain each window's extremum"
                 + ("; forward also saves their number per output (the loader stores it in the "
                    "smallest unsigned type holding it; the kernels take it as long long)."
                    if sel.counts else "."))
    if kernel.grad_start == "slices":  # -0 where an element is held by every window of every axis
        inside = " && ".join(f"sg_window_start(i{a}, l{a}, o{a}) == 0 && "
                             f"sg_window_end(i{a}, l{a}, o{a}) == o{a}" for a in range(spatial))
        out["grad_start"] = f"({inside}) ? -(acc)0 : (acc)0"
    scan = sel.form == "scan"  # the scan's kernels take the window box's sizes
    return out | {"spatial": spatial, "axes": list(range(spatial)), "box_index": box_index,
            "box_axes": list(range(spatial)) if scan else [], "box_sizes": " + box" if scan else "",
            "output_size": [("None" if o is None else str(o)) for o in op.params["output_size"]],
            "saved_doc": wrap(saved, 96, "  "), "windows_text": ADAPTIVE.doc(),
            "cuda_window_start": cuda_integer_code(ADAPTIVE.start),
            "cuda_window_end": cuda_integer_code(ADAPTIVE.end),
            "window_start": python_integer_code(ADAPTIVE.start),  # the loader's Python
            "window_end": python_integer_code(ADAPTIVE.end)}


# the strings each form of windows adds to the context (rows: none), by WindowKernel.windows
_FORM_STRINGS = {"strided": _strided_strings, "blocks": _blocks_strings, "spans": _cuda_adaptive,
                 "sampled": _cuda_fractional}


# the kernel forms this backend builds (lower.kernel_form; Backend.builds reads it)
FORMS = ("ElementwiseKernel", "UnpoolKernel", "LogSumExpKernel", "strided", "rows", "blocks", "spans",
         "sampled", "segments",
         "OrderKernel")  # (the order statistics, sort, topk, cummax, ...: cuda/order.py)


def refuses(op) -> bool:
    """Whether it refuses an op of a form it builds (Backend.builds): a reduction that skips NaN,
    the pyg preset of segments (lower.beats_start)."""
    return skips_nan(op) or beats_start(op)


def render(art: Artifacts) -> dict[str, str]:
    """{file name: file text}: the .cu kernels and the CuPy loader of an op."""
    if kernel_form(art.kernel) not in FORMS:
        raise ValueError(f"the cuda backend builds the {', '.join(FORMS)} forms only so far: expected "
                         f"one of those, got {art.op.name}'s kernel of form {kernel_form(art.kernel)!r}; "
                         f"use backend='numpy' for it")
    if isinstance(art.kernel, WindowKernel) and art.kernel.skips_nan:
        raise ValueError(f"{art.op.name}: the cuda backend builds reductions that propagate NaN, not one "
                         f"that skips NaN (nanmax/nanmin) yet: expected backend='numpy' or 'cpu'")
    if art.op.params.get("return_indices"):
        raise ValueError(f"{art.op.name}: return_indices=True is in the NumPy backend only; the CUDA "
                         f"module returns the output alone (use return_indices=False)")
    ctx = context(art)
    ctx |= preamble_context(header(art.op, "cuda"), ctx["loader_note"], LOADER_IMPORTS) | CUPY_ARRAYS
    env = environment("cuda", Path(__file__).parent / "templates")
    source, loader = file_names(art.op)
    return {source: env.get_template(ctx["template"]).render(**ctx),
            loader: env.get_template("cuda/loader.py.jinja").render(**ctx)}


def _special_cuda_context(op: Op, kernel) -> dict:
    if isinstance(kernel, UnpoolKernel):
        return dict(loader_geometry_partial="cuda/_loader_unpool.py.jinja",
                    template="cuda/unpool.cu.jinja", spatial=kernel.spatial,
                    keep=kernel.keep, each_writer=repr(kernel.each_writer), index_types_doc=False,
                    # every writer of a slot gets its gradient, or the one that stayed (its wins saved)
                    writers_partial=f"cuda/_unpool_{'each' if kernel.each_writer else 'one'}.jinja",
                    # the writer that stays has the largest tag: the last (i + 1) or the first (n - i)
                    stay_tag={"last": "i + 1", "first": "n - i"}[kernel.keep],
                    layouts_doc=False)
    real_types = []
    for rt in CUDA_REAL_TYPES:
        real_types.append({
            "name": rt,
            "combine": cuda_code(MaxOf(BEST, V), rt), "combine_params": _params(rt, str(BEST), str(V)),
            "shift": cuda_code(kernel.shift, rt), "shift_params": _params(rt, str(MAX_VALUE)),
            "term": cuda_code(kernel.term, rt), "term_params": _params(rt, str(V), str(M_SHIFT)),
            "output": cuda_code(kernel.output, rt), "output_params": _params(rt, str(M_SHIFT), str(SUM)),
            "weight": cuda_code(kernel.weight, rt),
            "weight_params": _params(rt, str(GRAD_OUTPUT), str(V), str(Y)),
        })
    return dict(loader_geometry_partial="cuda/_loader_logsumexp.py.jinja", empty_slices=True, template="cuda/logsumexp.cu.jinja", real_types=real_types,
                index_types_doc=False, layouts_doc=False, **half_context(kernel))
