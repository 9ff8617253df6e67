"""The cpu backend's order statistics (sort, topk, cummax, cummin, kthvalue, median, nanmedian:
lower.OrderKernel): order.c.jinja (the total-order key of each dtype, then the body the kernel
picks: a row's ranks by a k-bounded insertion or a stable merge sort, a prefix's running winner,
one rank of each row) and loader_order.py.jinja (the NumPy module's layout partials from host/,
its Saved field for field, the checks of what backward reads).  One thread a row; backward in
gather form from the saved ranks (each element written once: no atomics), tie blocks' gradients
added in float64 in the NumPy module's order and rounded once.  The strings are the C family's
(backends/cfamily/order.py); here the cpu's templates, bits types and printer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..cfamily.order import order_strings
from .printer import c_code

if TYPE_CHECKING:
    from ...lower import Artifacts

# (bits type, signed type, magnitude mask, +inf's bits, NumPy's NaN's bits) of each dtype's key
_BITS = {"f16": ("uint16_t", "int16_t", "0x7fffu", "0x7c00u", "0x7e00u"),
         "f32": ("uint32_t", "int32_t", "0x7fffffffu", "0x7f800000u", "0x7fc00000u"),
         "f64": ("uint64_t", "int64_t", "0x7fffffffffffffffull", "0x7ff0000000000000ull", "0x7ff8000000000000ull")}

# how the C family's shared helpers (cfamily/templates/_order_*.jinja) are spelled in C
_C_SPELLING = {"c_static": "static", "c_inline": "SG_INLINE", "c_restrict": "restrict",
               "c_copy_sorted": "if (sorted != a + lo) memcpy(a + lo, sorted, sizeof(sg_pair) * (size_t)(hi - lo + 1));"}


def order_context(art: Artifacts, base: dict) -> dict:
    """The .c source's and loader's finished strings, over the backend's base context."""
    weight = art.kernel.weight
    ctx = order_strings(art, base, _BITS, "" if weight is None else c_code(weight, "double"))
    body = ctx["body_name"]
    ctx |= {"template": "cpu/order.c.jinja", "loader_template": "cpu/loader_order.py.jinja",
            "body": f"cpu/_order_{body}.c.jinja", "loader_body": f"cpu/_loader_order_{body}.py.jinja"}
    ctx |= _C_SPELLING
    if "one_form" in ctx:
        form = ctx["one_form"]
        ctx |= {"one_backward": f"cpu/_order_one_{form}.c.jinja",
                "one_helpers": ["cpu/_order_one_block_helpers.c.jinja"] if form == "block" else []}
    return ctx
