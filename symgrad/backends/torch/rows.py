"""The torch backend's reductions (``lower.WindowKernel`` of windows "rows": amax, amin, max,
min): the template context of ``rows.py.jinja``, each reduced slice one row along the last axis,
its winner found by the NumPy module's closed forms (host.printer.numpy_scan_winner,
numpy_fold_winner, numpy_extremum_reduce) in torch operations: ``torch.argmax``/``argmin``,
which, like NumPy's, return the first NaN and the first of equal elements; ``torch.amax``/
``amin``, which propagate NaN.  Backward is a select per element (no element is in two rows), the
jvp of the mask forms a sum along the row.  No Python fold over a row's elements, no scatter, no
``.item()``, no branch on a tensor's values."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .window import GEOMETRY, _code

if TYPE_CHECKING:
    from ...lower import WindowKernel


def _first_true(h: str) -> str:
    """The index of each row's first True (0 where none)."""
    return f"torch.argmax({h}.to(torch.uint8), dim=-1)"


def _last_true(h: str) -> str:
    """The index of each row's last True (the last element where none)."""
    return f"{h}.shape[-1] - 1 - torch.argmax(torch.flip({h}, (-1,)).to(torch.uint8), dim=-1)"


def _arg_extremum(extremum: str, order: str, array: str) -> str:
    """The index of a row's first (order first) or last extremum, NaN winning."""
    arg = "torch.argmax" if extremum == "max" else "torch.argmin"
    if order == "first":
        return f"{arg}({array}, dim=-1)"
    return f"{array}.shape[-1] - 1 - {arg}(torch.flip({array}, (-1,)), dim=-1)"


def _inf(extremum: str) -> str:
    """The identity of the extremum: -inf for max, inf for min."""
    return "-math.inf" if extremum == "max" else "math.inf"


def scan_winner(extremum: str, order: str, nan) -> list[str]:
    """The lines of `_winner(rows)`: the index, along the last axis, that the running scan of the
    lowered `take` ends on (as host.printer.numpy_scan_winner: NaN by the scan's NaN rule)."""
    m = "amax" if extremum == "max" else "amin"
    pick = _first_true if order == "first" else _last_true
    takes, taken = ("number", False) if nan is None else (nan.nan_takes_over, nan.nan_is_taken_over)
    if takes == "number" and not taken:
        body = [f"return {_arg_extremum(extremum, order, 'rows')}"]
    elif takes == "always" and not taken:
        body = ["nan = torch.isnan(rows)  # rows holding NaN: their last NaN",
                f"return torch.where(nan.any(dim=-1), {_last_true('nan')}, {_arg_extremum(extremum, order, 'rows')})"]
    elif takes == "never" and not taken:
        body = [f"numbers = torch.where(torch.isnan(rows), {_inf(extremum)}, rows)  # NaNs passed over",
                f"hit = rows == torch.{m}(numbers, dim=-1, keepdim=True)",
                f"return torch.where(torch.isnan(rows[..., 0]), 0, {pick('hit')})"]
    elif takes == "always" and taken:
        body = ["nan = torch.isnan(rows)",
                f"last_nan = torch.where(nan.any(dim=-1), {_last_true('nan')}, -1)",
                "after = torch.arange(rows.shape[-1], device=rows.device) > last_nan[..., None]",
                f"rest = torch.where(after, rows, {_inf(extremum)})",
                f"hit = after & (rows == torch.{m}(rest, dim=-1, keepdim=True))",
                f"return torch.where(after[..., -1], {pick('hit')}, rows.shape[-1] - 1)"]
    else:
        raise ValueError(f"no closed form for a scan where NaN takes over {takes!r} and is taken over {taken!r}")
    return body


def fold_winner(extremum: str, zeros: str | None) -> list[str]:
    """The lines of `_fold_winner(rows)`: the index of the element that folding the row with the
    extremum step returns (as host.printer.numpy_fold_winner): the first NaN, else the last
    element equal to the extremum; under the zeros rule 'ordered' a +0 (max) or -0 (min) first."""
    m = "amax" if extremum == "max" else "amin"
    ordered = []
    if zeros == "ordered":
        sign = "~torch.signbit(rows)" if m == "amax" else "torch.signbit(rows)"
        ordered = [f"preferred = hit & {sign}  # -0 is below +0",
                   "hit = torch.where(preferred.any(dim=-1, keepdim=True), preferred, hit)"]
    elif zeros not in (None, "second"):
        raise ValueError(f"no fold winner for the zeros rule {zeros!r}")
    return ["nan = torch.isnan(rows)", f"hit = rows == torch.{m}(rows, dim=-1, keepdim=True)", *ordered,
            f"return torch.where(nan.any(dim=-1), {_first_true('nan')}, {_last_true('hit')})"]


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
        # the hits of each row counted exactly, held in at least float32 (as the NumPy module)
        "count_lines": ["count = hit.sum(dim=-1, keepdim=True).to(torch.promote_types(work, torch.float32))"]
        if sel.counts else [],
        "count_arg": ", count" if sel.counts else "",
        "count_doc": ", how many" if sel.counts else "",
    }
