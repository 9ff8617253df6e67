"""A row's winner in closed form, once for every array library: the element, along the last axis,
that a scan or fold over the row ends on, computed with a few whole-row calls (argmax, flips,
where) instead of a Python loop over the row's elements.  The NumPy module, the jax backend's
and the torch backend's reductions print the same statements, each in its own ``Dialect``: the
library's module name, its axis and keepdims keywords, how it reverses a row and finds the first
True, how it reduces past NaN; the NumPy module (eager) also names its steps and skips the NaN
work of a block that holds none.  The NumPy dialect is here; the jax and torch backends make
theirs (``Dialect(...)`` in their printers)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """How one array library writes the closed forms' calls.

    module: the module's name in the generated code (np, jnp, torch); axis: the last axis as a
    keyword (``axis=-1``); keep: keep the reduced axis (``keepdims=True``); reduce: a max/min's
    function name by extremum; flip: a row reversed ({a}); count: a Boolean array as argmax takes
    it ({h}); inf: +inf; arange: the indices of a row of {n} elements; numbers_hit: the lines
    setting ``hit`` to the elements of ``rows`` equal to the extremum of its numbers (NaNs passed
    over; {m}: max or min, {inf}: its identity); eager: the statements of an eager module (a
    branch on whether a block holds NaN at all, intermediate results named)."""

    module: str
    axis: str
    keep: str
    reduce: dict
    flip: str
    count: str
    inf: str
    arange: str
    numbers_hit: tuple
    eager: bool = False

    def call(self, name: str, *args: str) -> str:
        return f"{self.module}.{name}({', '.join(args)})"

    def first_true(self, h: str) -> str:
        """The index of each row's first True (0 where none)."""
        return self.call("argmax", self.count.format(h=h), self.axis)

    def last_true(self, h: str) -> str:
        """The index of each row's last True (the last element where none)."""
        return f"{h}.shape[-1] - 1 - {self.call('argmax', self.count.format(h=self.flip.format(a=h)), self.axis)}"

    def arg_extremum(self, extremum: str, order: str, a: str) -> str:
        """The index of a row's first (order first) or last extremum, NaN winning (argmax/argmin
        return the first NaN and the first of equal elements in every dialect)."""
        arg = "argmax" if extremum == "max" else "argmin"
        if order == "first":
            return self.call(arg, a, self.axis)
        return f"{a}.shape[-1] - 1 - {self.call(arg, self.flip.format(a=a), self.axis)}"

    def isnan(self, a: str) -> str:
        """Whether each element of the array a (its code) is NaN."""
        return f"{self.module}.isnan({a})"

    def signbit(self, a: str) -> str:
        """Whether each element of the array a (its code) has its sign bit set."""
        return f"{self.module}.signbit({a})"

    def extremum_step(self, extremum: str, a: str, b: str) -> str:
        """One step of a max/min fold with the rule stated for every dtype: a where a is NaN or
        beats b strictly, else b (NaN propagates; of two equal values, +0 and -0 included, the
        second), as the CUDA fold."""
        where, isnan = f"{self.module}.where", f"{self.module}.isnan"
        return f"{where}({isnan}({a}) | ({a} {'>' if extremum == 'max' else '<'} {b}), {a}, {b})"

    def neg_inf(self, extremum: str) -> str:
        """The identity of the extremum: -inf for max, inf for min."""
        return f"-{self.inf}" if extremum == "max" else self.inf


NUMPY = Dialect(module="np", axis="axis=-1", keep="keepdims=True", reduce={"max": "max", "min": "min"},
                flip="{a}[..., ::-1]", count="{h}", inf="np.inf", arange="np.arange({n})",
                numbers_hit=("hit = rows == np.f{m}.reduce(rows, axis=-1, keepdims=True)  # NaNs passed over",),
                eager=True)


def scan_winner(d: Dialect, extremum: str, order: str, nan) -> list[str]:
    """The body of `_winner(rows)`: the index, along the last axis, that the running scan of the
    lowered `take` ends on.

    With no NaN the scan ends on the first (order first) or last (order last) element attaining
    the extremum.  NaN, by the scan's NaN rule (``policy.NanRule``; None: a window of one element):
    where a NaN takes over from a number only and is never taken over (dominate), argmax/argmin
    already treat NaN as the extremum (first NaN; reversed: last NaN); where it always takes over
    and is never taken over (last_nan), the last NaN; where it never takes over (keep), a NaN
    first element keeps it and other NaNs are passed over; where it takes over and is taken over
    (replace), the scan restarts after the last NaN (which wins if it is the last element)."""
    m = d.reduce[extremum]
    pick = d.first_true if order == "first" else d.last_true
    where = f"{d.module}.where"
    takes, taken = ("number", False) if nan is None else (nan.nan_takes_over, nan.nan_is_taken_over)
    arg = d.arg_extremum(extremum, order, "rows")
    if nan is not None and nan.nan_loses:  # skip (nanmax/nanmin): NaNs passed over, none: the first
        return [*(line.format(m=m, inf=d.neg_inf(extremum)) for line in d.numbers_hit),
                f"return {where}(hit.any({d.axis}), {pick('hit')}, 0)  # only NaN: the first"]
    if takes == "number" and not taken:
        return [f"return {arg}"]
    if takes == "always" and not taken:
        if d.eager:
            return [f"winner = {arg}", f"nan = {d.isnan('rows')}",
                    "if nan.any():  # rows holding NaN: their last NaN",
                    f"    winner = {where}(nan.any({d.axis}), {d.last_true('nan')}, winner)", "return winner"]
        return [f"nan = {d.isnan('rows')}  # rows holding NaN: their last NaN",
                f"return {where}(nan.any({d.axis}), {d.last_true('nan')}, {arg})"]
    if takes == "never" and not taken:
        return [*(line.format(m=m, inf=d.neg_inf(extremum)) for line in d.numbers_hit),
                f"return {where}({d.isnan('rows[..., 0]')}, 0, {pick('hit')})"]
    if takes == "always" and taken:
        restart = ["restart = " + pick("hit")] if d.eager else []
        return [f"nan = {d.isnan('rows')}",
                f"last_nan = {where}(nan.any({d.axis}), {d.last_true('nan')}, -1)",
                f"after = {d.arange.format(n='rows.shape[-1]')} > last_nan[..., None]",
                f"rest = {where}(after, rows, {d.neg_inf(extremum)})",
                f"hit = after & (rows == {d.module}.{m}(rest, {d.axis}, {d.keep}))",
                *restart,
                f"return {where}(after[..., -1], {'restart' if d.eager else pick('hit')}, rows.shape[-1] - 1)"]
    raise ValueError(f"no closed form for a scan where NaN takes over {takes!r} and is taken over {taken!r}")


def fold_winner(d: Dialect, extremum: str, zeros: str | None) -> list[str]:
    """The body of `_fold_winner(rows)`: the index, along the last axis, of the element that
    folding the row with the extremum step returns (a when a is NaN or beats b strictly, else b):
    the first NaN, else the last element equal to the extremum (+0 and -0 included; the first under
    the zeros rule 'first').  Under the zeros rule 'ordered' (-0 below +0) a +0 (max) or -0 (min)
    among the hits comes first."""
    m, where = d.reduce[extremum], f"{d.module}.where"
    ordered = []
    if zeros == "ordered":
        sign = f"{'~' if extremum == 'max' else ''}{d.signbit('rows')}"
        ordered = [f"preferred = hit & {sign}  # -0 is below +0",
                   f"hit = {where}(preferred.any({d.axis}, {d.keep}), preferred, hit)"]
    elif zeros not in (None, "second", "first"):
        raise ValueError(f"no fold winner for the zeros rule {zeros!r}")
    which, pick = ("first", d.first_true) if zeros == "first" else ("last", d.last_true)
    named = f"{which}_hit" if d.eager else pick("hit")
    return [f"nan = {d.isnan('rows')}", f"hit = rows == {d.module}.{m}(rows, {d.axis}, {d.keep})", *ordered,
            *([f"{which}_hit = {pick('hit')}"] if d.eager else []),
            f"return {where}(nan.any({d.axis}), {d.first_true('nan')}, {named})"]


def function(name: str, doc: str, body: list[str]) -> str:
    """A module-level function of one argument ``rows``: its text."""
    return "\n".join([f"def {name}(rows):", f'    """{doc}"""'] + ["    " + line for line in body])


SCAN_DOC = "The element the running scan of each row (last axis) ends on."


def fold_doc(extremum: str) -> str:
    return f"The element the running {extremum} of each row (last axis) returns."
