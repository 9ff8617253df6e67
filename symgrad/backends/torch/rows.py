"""The torch backend's reductions (``lower.WindowKernel`` of windows "rows": amax, amin, max,
min): the template context of ``rows.py.jinja``, each reduced slice one row along the last axis,
its winner found by the NumPy module's closed forms (host.winners, in the torch dialect; the
extremum as host.printer.numpy_extremum_reduce) in torch operations: ``torch.argmax``/``argmin``,
which, like NumPy's, return the first NaN and the first of equal elements; ``torch.amax``/
``amin``, which propagate NaN.  Backward is a select per element (no element is in two rows), the
jvp of the mask forms a sum along the row.  No Python fold over a row's elements, no scatter, no
``.item()``, no branch on a tensor's values."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..host import winners
from ..host.winners import Dialect
from .window import GEOMETRY, _code

if TYPE_CHECKING:
    from ...lower import WindowKernel


TORCH = Dialect(module="torch", axis="dim=-1", keep="keepdim=True", reduce={"max": "amax", "min": "amin"},
                flip="torch.flip({a}, (-1,))", count="{h}.to(torch.uint8)", inf="math.inf",
                arange="torch.arange({n}, device=rows.device)",
                numbers_hit=("numbers = torch.where(torch.isnan(rows), {inf}, rows)  # NaNs passed over",
                             "hit = rows == torch.{m}(numbers, dim=-1, keepdim=True)"))


def scan_winner(extremum: str, order: str, nan) -> list[str]:
    """The lines of `_winner(rows)` (winners.scan_winner in torch)."""
    return winners.scan_winner(TORCH, extremum, order, nan)


def fold_winner(extremum: str, zeros: str | None) -> list[str]:
    """The lines of `_fold_winner(rows)` (winners.fold_winner in torch)."""
    return winners.fold_winner(TORCH, extremum, zeros)


def extremum_reduce(extremum: str, zeros: str | None) -> list[str]:
    """The lines of `_extremum(rows)`: the extremum along the last axis (NaN propagating), as
    host.printer.numpy_extremum_reduce; under the zeros rule 'ordered' a zero extremum is +0
    where the row holds a +0 (max; min: -0 where it holds a -0)."""
    m = "amax" if extremum == "max" else "amin"
    if zeros is None:
        return [f"return torch.{m}(rows, dim=-1)"]
    if zeros != "ordered":
        raise ValueError(f"no reduction for the zeros rule {zeros!r}")
    wins = "~torch.signbit(rows)" if m == "amax" else "torch.signbit(rows)"
    signs = "0.0, -0.0" if m == "amax" else "-0.0, 0.0"
    return [f"extremum = torch.{m}(rows, dim=-1)",
            f"zero = torch.where(((rows == 0) & {wins}).any(dim=-1), {signs}).to(rows.dtype)",
            "return torch.where(extremum == 0, zero, extremum)"]


def rows_context(op, kernel: WindowKernel) -> dict:
    """The template context of a reduction's module (rows.py.jinja): finished strings only."""
    sel = kernel.selection
    scan = sel.form == "scan"
    fold = scan and not sel.winner_is_output
    return {
        "selection_partial": f"torch/_rows_{sel.form}.py.jinja",
        "geometry_partial": GEOMETRY["rows"],
        # (the host layer's _layout: a product of Python ints, which Dynamo traces, not np.prod)
        "reduced_length": "math.prod([shape[i] for i in dims])",
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "scan_order": sel.order or "first",
        "scan_winner": scan_winner(sel.extremum, sel.order, sel.nan) if scan else [],
        "fold_winner": fold_winner(sel.extremum, op.zeros) if fold else [],
        "output_fold": ["winner = _fold_winner(rows)  # under this NaN rule the output is the fold's, "
                        "not the winner"] if fold else [],
        "extremum_reduce": [] if scan else extremum_reduce(sel.extremum, op.zeros),
        "hit": "" if scan else _code(sel.hit),
        "weight": "" if scan else _code(sel.weight),
        # the torch preset (conventions.TANGENT_SUMS "torch"): jvp adds these terms by at::sum
        "tangent_term": _code(kernel.tangent_term) if kernel.tangent_term is not None else "",
        # the hits of each row counted exactly, held in at least float32 (as the NumPy module)
        "count_lines": ["count = hit.sum(dim=-1, keepdim=True).to(torch.promote_types(work, torch.float32))"]
        if sel.counts else [],
        "count_arg": ", count" if sel.counts else "",
        "count_doc": ", how many" if sel.counts else "",
    }
