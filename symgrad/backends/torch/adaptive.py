"""The torch backend's adaptive max pooling (``lower.WindowKernel`` of windows "spans"): the
template context of ``adaptive.py.jinja``, printed as plain PyTorch code.

The windows are PyTorch's adaptive ones (host.adaptive_window_code: the NumPy module's integer
geometry, here over Python ints, so the windows are constants of the traced graph).  Forward is
the NumPy module's "box" strategy: one gather per element of the window box (the largest window
along each axis) over all windows at once, in row-major order, masked where a window is smaller;
backward is in gather form, one pass per holding window (each input element's m-th window), in
the order the NumPy module adds an element's windows' gradients (WindowKernel.grad_order).  No
scatter, no atomics, no ``.item()``, no branch on a tensor's values."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from ..common import grad_start_comment
from ..host import adaptive_window_code, winners
from .printer import nan_test
from .rows import POSITIONS, TORCH, extremum_reduce
from .window import _code, _fold

if TYPE_CHECKING:
    from ...lower import WindowKernel


def _step(op, sel, a: str) -> str:
    """a folded with v by the NumPy module's rule for whole rows (host.printer.numpy_extremum_step,
    the same for every dtype: a where a is NaN or beats v strictly, else v), or the zeros rule's
    lowered fold (op.zeros)."""
    if op.zeros is not None:
        return _fold(sel, a)
    return TORCH.extremum_step(sel.extremum, a, "v")


def _scan(op, kernel: WindowKernel) -> dict:
    """The scan form: take, and where the output is the NaN-propagating fold (keep/replace) rather
    than the winner, the fold's lines (a window without the element keeps its fold)."""
    sel = kernel.selection
    output_is_fold = not sel.winner_is_output
    return {"take": _code(sel.take),
            "fold_start": ["out = best  # under this NaN rule the winner of a NaN window need not be the NaN"]
            if output_is_fold else [],
            "fold_step": [f"folded = {_step(op, sel, 'out')}",
                          "out = folded if w.valid is None else torch.where(w.valid, folded, out)"]
            if output_is_fold else [],
            "result": "out" if output_is_fold else "best"}


_COUNT = ["count = torch.zeros(extremum.shape, dtype=torch.int64, device=extremum.device)",
          "for w in elements:",
          "    hit = _hit(x[w.at], extremum)",
          "    count = count + (hit if w.valid is None else hit & w.valid)",
          "return count.to(torch.promote_types(dtype, torch.float32))"]


def _mask(op, kernel: WindowKernel) -> dict:
    sel = kernel.selection
    return {"combine": _step(op, sel, "best"), "hit": _code(sel.hit), "weight": _code(sel.weight),
            "count_body": _COUNT if sel.counts else ["return None"]}


_WHOLE_COUNT = ["count = _rows(hit).sum(-1).reshape(layout.out_plane).to(torch.promote_types(dtype, torch.float32))"]
_WHOLE_NO_COUNT = ["count = None  # the weight needs no count"]


def _fold_lines(extremum: str, zeros: str | None) -> list[str]:
    """The lines of `_fold(rows)`: the value the running extremum step (a where a is NaN or beats b
    strictly, else b) returns over each row, the element winners.fold_winner finds: the row's
    first NaN, else its extremum, a zero one by the zeros rule (None: the last zero, as the fold).
    Every reduction reads the row once, none needs another's result (no hit mask of the extremum
    and no second pass), so Inductor makes them one pass over the plane."""
    *body, last = extremum_reduce(extremum, zeros or "second", d=POSITIONS)
    n, at = "rows.shape[-1]", POSITIONS.arange.format(n="rows.shape[-1]")
    return [f"first_nan = torch.amin(torch.where({nan_test('rows')}, {at}, {n}), dim=-1)  # {n}: none",
            *body,
            f"value = {last.removeprefix('return ')}",
            f"nan = torch.gather(rows, -1, (first_nan % {n})[..., None])[..., 0]",
            f"return torch.where(first_nan < {n}, nan, value)"]


def _whole(op, kernel: WindowKernel) -> dict:
    """Where every output size is 1 (global pooling, the benchmark CNN's last pool), each plane is
    one window: forward finds its winner in closed form over the plane as one row (rows.py's
    _winner, and _fold: a few whole-row reductions that Inductor fuses) instead of a scan
    over the box's elements (256 passes over a 16x16 plane), and backward is one select per element.
    {"whole": False} where an output size is not 1, or no closed form holds the scan's NaN rule."""
    sel = kernel.selection
    scan = sel.form == "scan"
    none = {"whole": False, "winner_lines": [], "fold_lines": [], "output_fold": [], "extremum": sel.extremum,
            "whole_count": _WHOLE_COUNT if sel.counts else _WHOLE_NO_COUNT}
    size = op.params.get("output_size")  # (fractional pooling's, which has its windows, may be None)
    if kernel.windows != "spans" or size is None or any(o != 1 for o in size):
        return none
    try:
        winner = winners.scan_winner(POSITIONS, sel.extremum, sel.order, sel.nan) if scan else []
        fold = [] if scan and sel.winner_is_output else _fold_lines(sel.extremum, op.zeros)
    except ValueError:
        return none
    return {"whole": True, "winner_lines": winner, "fold_lines": fold, "extremum": sel.extremum,
            "whole_count": _WHOLE_COUNT if sel.counts else _WHOLE_NO_COUNT,
            "output_fold": ["best = _fold(rows)[:, None]  # under this NaN rule the output is the fold's, not the winner"]
            if fold else ["best = torch.gather(rows, -1, winner[:, None])"]}


def adaptive_context(op, kernel: WindowKernel) -> dict:
    """The template context of an adaptive max pooling module: finished strings only."""
    sel = kernel.selection
    if kernel.grad_start not in ("+0", "slices") or kernel.grad_order not in ("output", "reversed"):
        raise ValueError(f"{op.name}: the torch backend has no gradient start {kernel.grad_start!r} "
                         f"in order {kernel.grad_order!r} for adaptive windows")
    scan = sel.form == "scan"
    reversed_order = kernel.grad_order == "reversed"
    bfloat16_adds = kernel.bfloat16_adds == "bfloat16"
    return {
        "scan": scan,
        "spatial": op.spec.spatial,
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "bfloat16_adds": bfloat16_adds,
        "bfloat16_doc": textwrap.wrap(
            "bfloat16: backward adds each window's gradient to its winner's in bfloat16, each add rounded "
            "(WindowKernel.bfloat16_adds); forward and jvp compute in float32 and round once"
            if bfloat16_adds else
            "bfloat16 is computed in float32 and rounded once, as the NumPy module computes it", 94),
        "slices_start": kernel.grad_start == "slices",
        "grad_start_doc": textwrap.wrap(f'"""The gradient\'s start: {grad_start_comment(kernel.grad_start)}."""', 94),
        "grad_order": kernel.grad_order,
        "holders_in_order": "holders[::-1]" if reversed_order else "holders",
        "order_words": "reversed output order, each window's weight rounded to the dtype first"
        if reversed_order else "output (row-major) order",
        # reversed (JAX's slices): each window's weight rounded to the dtype before it is added
        "weight_rounding": ["weight = weight.to(dtype)  # a window's gradient: a tensor of the dtype"]
        if reversed_order else [],
        "forward_result": "(output, indices(saved))" if op.params.get("return_indices") else "output",
        **adaptive_window_code(),
        **_whole(op, kernel),
        **(_scan(op, kernel) if scan else _mask(op, kernel)),
    }
