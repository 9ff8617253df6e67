"""The torch backend's order statistics (``lower.OrderKernel``: sort, topk, cummax, cummin,
kthvalue, median, nanmedian): the template context of ``order.py.jinja`` and the body the kernel
picks, printed as plain PyTorch code with the NumPy module's results bit for bit on the CPU.

Forward ranks each row by the NumPy module's total-order key (the float's bits as an integer of
its width: NaN above +inf, every NaN equal; -0 below +0 or equal to it) with PyTorch's stable
argsort (ties in index order; "last": the row reversed, positions mapped back), or, for the
cumulative ops, a running maximum of the key (torch.cummax).  Backward is in gather form from the
saved ranks or indices (a permutation's writes: each element written once; no scatter_add, no
atomics); the tie blocks' sums are added in float64 in the NumPy module's order (a running sum
along the ranks), each result rounded once to the dtype (float16 from float64 by way of float32
rounded to odd: PyTorch's own cast rounds twice).  No ``.item()``, no ``.numpy()``, no branch on a
tensor's values: forward, backward and jvp trace under torch.compile(fullgraph=True)."""

from __future__ import annotations

from ...lower import OrderKernel
from ..host.order import OrderDialect
from ..host.order import order_context as _context
from .printer import torch_code

TORCH_ORDER = OrderDialect(
    templates="torch", code=lambda e: torch_code(e, []),
    ranked={"first": "torch.argsort(key, dim=-1, stable=True)",
            "last": "key.shape[-1] - 1 - torch.argsort(torch.flip(key, (-1,)), dim=-1, stable=True)"},
    rising="rising = torch.cat([torch.ones_like(takes[..., :1]), best[..., 1:] > best[..., :-1]], -1)",
    grad_values={"written": "g", "added": "g + 0", "negated": "-(0 - g)"},
    grad_zeros={"written": "torch.zeros", "added": "torch.zeros", "negated": "-torch.zeros"},
    numbers="numbers = (~torch.isnan(v)).sum(-1, keepdim=True)",
    rank_k="torch.full(v.shape[:-1] + (1,), K - 1, dtype=torch.int64, device=v.device)",
    middle_low="torch.where(nan_row, numbers, (n - 1) // 2)", middle_high="torch.where(nan_row, numbers, n // 2)",
    numbers_low="torch.clamp(numbers - 1, min=0) // 2",
    concat="torch.cat([{a}, {b}], -1)",
    pair_value="(chosen[..., 0] + chosen[..., 1]) * 0.5",
    selected_nan="torch.isnan(torch.gather(_saved_rows(saved), -1, picked[..., :1]))",
    canonical="canonical = torch.where(canonical == 0, torch.zeros_like(v), canonical)  # -0 as +0",
    nan_top="torch.where(torch.isnan(v), torch.iinfo(_BITS[v.dtype]).max, ~_key(v))",
    module="torch", accumulate="torch.{f}(v, -1).values",
    kept="torch.cummax({a}.to(torch.uint8), -1).values.bool()", to_dtype="{a}.to(v.dtype)",
    zero_where="{name} = torch.where({cond}, 0.0, {name})")


def order_context(op, kernel: OrderKernel) -> dict:
    """What order.py.jinja and its body place (host.order, in torch operations)."""
    return _context(op, kernel, TORCH_ORDER)
