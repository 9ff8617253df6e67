"""The torch backend's reductions (``lower.WindowKernel`` of windows "rows": amax, amin, max,
min, nanmax, nanmin): the template context of ``rows.py.jinja``, each reduced slice one row along
the last axis, its winner found by the NumPy module's closed forms (host.winners, in the torch dialect; the
extremum as host.printer.numpy_extremum_reduce) in torch operations: ``torch.argmax``/``argmin``,
which, like NumPy's, return the first NaN and the first of equal elements; ``torch.amax``/
``amin``, which propagate NaN.  Backward is a select per element (no element is in two rows), the
jvp of the mask forms a sum along the row.  No Python fold over a row's elements, no scatter, no
``.item()``, no branch on a tensor's values."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ...lower import V
from ..host import winners
from ..host.winners import Dialect
from .printer import nan_test, sign_test
from .window import GEOMETRY, _code

if TYPE_CHECKING:
    from ...lower import WindowKernel


TORCH = Dialect(module="torch", axis="dim=-1", keep="keepdim=True", reduce={"max": "amax", "min": "amin"},
                flip="torch.flip({a}, (-1,))", count="{h}.to(torch.uint8)", inf="math.inf",
                arange="torch.arange({n}, device=rows.device)",
                numbers_hit=("numbers = torch.where(torch.isnan(rows), {inf}, rows)  # NaNs passed over",
                             "hit = rows == torch.{m}(numbers, dim=-1, keepdim=True)"))


class Positions(Dialect):
    """TORCH with a row's first (last) True found as the least (greatest) position holding
    one: an integer min (max) that Inductor's C++ vectorizes, where its argmax of a Boolean row
    combines an index-value pair per element (a whole-plane adaptive pool under the mask form ran
    10x PyTorch's own, compiled, on the benchmark CNN's 64x64x16x16; the split amax's zero
    rule likewise); NaN and sign tests in the
    forms Inductor vectorizes (printer.nan_test, sign_test)."""

    def first_true(self, h: str) -> str:
        n = f"{h}.shape[-1]"
        return f"torch.amin(torch.where({h}, {self.arange.format(n=n)}, {n}), dim=-1) % {n}"

    def last_true(self, h: str) -> str:
        n = f"{h}.shape[-1]"
        return f"(torch.amax(torch.where({h}, {self.arange.format(n=n)}, -1), dim=-1) + {n}) % {n}"

    def isnan(self, a: str) -> str:
        return nan_test(a)

    def signbit(self, a: str) -> str:
        return sign_test(a)


POSITIONS = Positions(**{f.name: getattr(TORCH, f.name) for f in dataclasses.fields(TORCH)})


def scan_winner(extremum: str, order: str, nan) -> list[str]:
    """The lines of `_winner(rows)` (winners.scan_winner in torch)."""
    return winners.scan_winner(TORCH, extremum, order, nan)


def fold_winner(extremum: str, zeros: str | None) -> list[str]:
    """The lines of `_fold_winner(rows)` (winners.fold_winner in torch)."""
    return winners.fold_winner(TORCH, extremum, zeros)


def extremum_reduce(extremum: str, zeros: str | None, skip_nan: bool = False, array: str = "rows",
                    d: Dialect = TORCH) -> list[str]:
    """The lines of `_extremum(rows)`: the extremum along the last axis (NaN propagating), as
    host.printer.numpy_extremum_reduce; under the zeros rule 'ordered' a zero extremum is +0
    where the row holds a +0 (max; min: -0 where it holds a -0); under 'first' ('second') it is
    the row's first (last) zero.  ``skip_nan`` (nanmax/nanmin): the extremum of the row with each
    NaN read as -inf (+inf for a min), NaN where the row holds only NaN.  d: the dialect of a
    row's first/last True and the sign test."""
    m = "amax" if extremum == "max" else "amin"
    if skip_nan:
        inf = TORCH.neg_inf(extremum)
        *body, last = extremum_reduce(extremum, zeros, array="numbers", d=d)
        return [f"numbers = torch.where(torch.isnan(rows), {inf}, rows)  # NaNs passed over", *body,
                f"return torch.where(torch.isnan(rows).all(dim=-1), math.nan, {last.removeprefix('return ')})"]
    if zeros is None:
        return [f"return torch.{m}({array}, dim=-1)"]
    if zeros in ("first", "second"):  # a zero extremum is the row's first (last) zero
        at = (d.first_true if zeros == "first" else d.last_true)(f"({array} == 0)")
        return [f"extremum = torch.{m}({array}, dim=-1)",
                f"zero = torch.gather({array}, -1, ({at})[..., None])[..., 0]",
                "return torch.where(extremum == 0, zero, extremum)"]
    if zeros != "ordered":
        raise ValueError(f"no reduction for the zeros rule {zeros!r}")
    # the zero is read only where the extremum is a zero, so no element is NaN and every element is
    # <= 0 (max; min: >= 0): the row holds a +0 (-0) exactly where the greatest (least) of its
    # elements' signs, ones.copysign(v), is +1 (-1): one float reduction of the row, which Inductor
    # fuses with the extremum's, where a test of (v == 0) & sign made it store Boolean rows (the
    # jax preset's global adaptive pool on the benchmark CNN)
    sign = f"torch.ones_like({array}).copysign({array})"
    held = f"torch.amax({sign}, dim=-1) > 0" if m == "amax" else f"torch.amin({sign}, dim=-1) < 0"
    signs = "0.0, -0.0" if m == "amax" else "-0.0, 0.0"
    return [f"extremum = torch.{m}({array}, dim=-1)",
            f"zero = torch.where({held}, {signs}).to({array}.dtype)",
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
        # (NaN skipped: of +0 and -0 the second, as the NumPy module, where no rule is given)
        "extremum_reduce": [] if scan else extremum_reduce(
            sel.extremum, op.zeros or ("second" if kernel.skips_nan else None), kernel.skips_nan, d=POSITIONS),
        "hit": "" if scan else _code(sel.hit),
        "weight": "" if scan else _code(sel.weight),
        # the torch preset (conventions.TANGENT_SUMS "torch"): jvp adds these terms by at::sum
        "tangent_term": _code(kernel.tangent_term) if kernel.tangent_term is not None else "",
        # the hits of each row counted exactly, held in at least float32 (as the NumPy module)
        "count_lines": ["count = hit.sum(dim=-1, keepdim=True).to(torch.promote_types(work, torch.float32))"]
        if sel.counts else [],
        "count_arg": ", count" if sel.counts else "",
        "count_doc": ", how many" if sel.counts else "",
        "nan_words": NAN_WORDS[kernel.skips_nan],
        **element_args(sel, kernel),
    }


# how the mask form's extremum reads NaN, by WindowKernel.skips_nan (nanmax/nanmin)
NAN_WORDS = {False: "NaN propagating", True: "NaN skipped; NaN where the row holds only NaN"}


def element_args(sel, kernel: WindowKernel) -> dict:
    """Where the mask's weight or jvp term reads the element itself (nanmax/nanmin's 'fill'): the
    parameter, and the arguments passing the saved input as rows (weight) or as it is (term)."""
    if sel.form != "mask" or not any(V in e.free_symbols for e in (sel.weight, kernel.tangent_term)
                                     if e is not None):
        return {"element_param": "", "element_rows": "", "element_input": ""}
    return {"element_param": ", v", "element_rows": ", _rows(saved.x.to(_working(saved.dtype)), *layout[:3])",
            "element_input": ", saved.x"}
