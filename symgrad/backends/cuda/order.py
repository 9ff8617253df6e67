"""The cuda backend's order statistics (sort, topk, cummax, cummin, kthvalue, median, nanmedian:
lower.OrderKernel): order.cu.jinja (each dtype's total-order key, then the body the kernel picks,
one thread a row: a row's ranks by a k-bounded insertion or a stable merge sort, a prefix's
running winner or JAX's tree, one rank of each row by a quickselect) and _loader_order.py.jinja
(the NumPy module's Saved field for field, the rows on the device, the checks of what backward
reads).  Backward and jvp gather from the saved ranks: a row's thread writes its row (no atomics);
tie blocks' gradients are added in float64 in the NumPy module's order and rounded once.  The
strings are the C family's (backends/cfamily/order.py); here the cuda's templates, bits, rounding
and the loader's strings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lower import OrderKernel
from ..cfamily.order import order_strings
from .printer import cuda_code

if TYPE_CHECKING:
    from ...lower import Artifacts

# (bits type, signed type, magnitude mask, +inf's bits, NumPy's NaN's bits) of each dtype's key
_BITS = {"f16": ("unsigned short", "short", "0x7fffu", "0x7c00u", "0x7e00u"),
         "bf16": ("unsigned short", "short", "0x7fffu", "0x7f80u", "0x7fc0u"),
         "f32": ("unsigned int", "int", "0x7fffffffu", "0x7f800000u", "0x7fc00000u"),
         "f64": ("unsigned long long", "long long", "0x7fffffffffffffffull", "0x7ff0000000000000ull",
                 "0x7ff8000000000000ull")}
# each dtype: (its bits, the compute type, a result rounded as the NumPy module rounds it in the
# dtype, a float64 sum rounded once to the dtype, the words): bfloat16 as the NumPy module's
# wrappers compute it, in float32 (each step rounded to float) and rounded once to bfloat16
_DTYPES = {
    "f16": ("v.bits", "float", "sg_half_to_float(sg_float_to_half(v))", "sg_double_to_half(w)",
            "each step rounded to float16, as NumPy's float16"),
    "bf16": ("v.bits", "float", "v", "sg_float_to_bfloat16((float)w)",
             "computed as float32 (the NumPy module's bfloat16 wrappers), rounded once to bfloat16"),
    "f32": ("__float_as_uint(v)", "float", "v", "(float)w", "computed in float"),
    "f64": ("(unsigned long long)__double_as_longlong(v)", "double", "v", "w", "computed in double")}

# how the C family's shared helpers (cfamily/templates/_order_*.jinja) are spelled in CUDA
_CUDA_SPELLING = {"c_static": "__device__", "c_inline": "__device__ __forceinline__", "c_restrict": "__restrict__",
                  "c_copy_sorted": "if (sorted != a + lo) for (I i = 0; i <= hi - lo; ++i) a[lo + i] = sorted[i];"}


def order_context(art: Artifacts, base: dict) -> dict:
    """The .cu source's and loader's finished strings, over the backend's base context."""
    kernel = art.kernel
    assert isinstance(kernel, OrderKernel)
    weight = "" if kernel.weight is None else cuda_code(kernel.weight, "double")
    dtypes = [dt | _dtype_strings(dt["name"]) for dt in base["dtypes"]]
    ctx = order_strings(art, base | {"dtypes": dtypes}, _BITS, weight)
    body = ctx["body_name"]
    if kernel.tree:  # JAX's tree: the sign of a zero on its bits; a binary step's winners, NaN
        wins = ctx["wins"]  # propagating: the operands equal to its result, the running one kept
        ctx |= {"kept_sign": ctx["kept_sign"].replace("signbit", "sg_signbit"),
                "tree_wins": f"(!sg_isnan(a) && !sg_isnan(b) && (a) {wins} (b))",
                "tree_keeps": f"a {wins} b || sg_isnan(a)"}
    for dt in ctx["dtypes"]:
        if "values_param" in dt:
            dt["values_param"] = dt["values_param"].replace("restrict", "__restrict__")
        if kernel.select == "one" and kernel.midpoint:  # the mean of the two middle elements
            name, a = dt["name"], dt["acc"]
            chosen = [f"sg_load_{name}(row[ranked[{rank}].at])" for rank in ("low", "next")]
            dt["value"] = f"sg_store_{name}(sg_r_{name}({chosen[0]} + {chosen[1]}) * ({a})0.5)"
    ctx |= _CUDA_SPELLING
    ctx |= {"template": "cuda/order.cu.jinja", "body": f"cuda/_order_{body}.cu.jinja",
            "loader_geometry_partial": "cuda/_loader_order.py.jinja",
            "loader_body": f"cuda/_loader_order_{'one' if body == 'one' else body}.py.jinja",
            "index_types_doc": False, "layouts_doc": False,
            "float64_doc": _float64_doc(kernel),
            "whole": kernel.select == "one" and art.op.params["dim"] is None,
            "piecewise_linear": art.piecewise_linear}
    if "one_form" in ctx:
        ctx |= _one_strings(ctx, kernel)
    return ctx


def _one_strings(ctx: dict, kernel: OrderKernel) -> dict:
    """kthvalue, median, nanmedian: the backward partial, and the loader's output, its saved
    input (where backward reads it) and the words on it."""
    form = ctx["one_form"]
    keeps_x = len(kernel.saved) > 1
    return {"one_backward": f"cuda/_order_one_{form}.cu.jinja",
            "one_helpers": ["cuda/_order_one_block_helpers.cu.jinja"] if form == "block" else [],
            "cuda_output": "values" if ctx["whole"] else "(values, _reduced(cp, picked[..., 0], tuple(x.shape)))",
            "cuda_saved_args": "picked, _dense(x)" if keeps_x else "picked",
            "x_array": ' + [("x", tuple(saved.input_shape), saved.dtype, None)]' if keeps_x else "",
            "x_rows": "_rows(cp, saved.x)" if keeps_x else "cp.empty(1, dtype=saved.dtype)  # (x not read)",
            "x_doc": " and the input" if keeps_x else ""}


def _dtype_strings(name: str) -> dict:
    bits_of, acc, step, from_double, doc = _DTYPES[name]
    return {"bits_of": bits_of, "acc": acc, "step": step, "from_double": from_double, "rounding_doc": doc}


def _float64_doc(kernel: OrderKernel) -> list[str]:
    """The header's words on float64 math in float32/16 kernels: only the tie blocks' sums."""
    if kernel.ties != "block":
        return ["No float64 math in the float32, float16 and bfloat16 kernels."]
    return ["Float64 in every dtype's backward and jvp: a tie block's gradients are added in float64 and",
            "rounded once, as the NumPy module adds them (its forward does no float64 math)."]
