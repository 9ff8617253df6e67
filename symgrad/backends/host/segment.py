"""The strings of a segment kernel's (scatter_max, segment_max) host code that differ between an
input tensor as its initial element (scatter) and a fill (segment_max): the NumPy module's and the
cpu loader's (their layout partials host/_segment_scatter and host/_segment_fill)."""

import sympy as sp

from ...lower import EXTREMUM, V

# the names the printed hit and weight expressions give the element and its segment's extremum
SYMBOLS = {V: sp.Symbol("v", real=True), EXTREMUM: sp.Symbol("extremum", real=True)}


def sized_by_values(op) -> bool:
    """segment_max without num_segments: the output's size would be read from the ids' values
    (which the framework backends do not do: jax.ops.segment_max needs it under jit too)."""
    return op.params.get("num_segments", 0) is None


# the strings that differ between an input tensor as the initial element (scatter) and a fill
SEGMENT_INITIAL = {
    "input": {"layout_partial": "host/_segment_scatter.py.jinja", "dim": "_dim(len(saved.output_shape))",
              "returns": "(_placed(grad_initial, saved.output_shape, d), None, _placed(grad_src, saved.src_shape, d))",
              "grads_doc": "grad_input, None, grad_src",
              "initial_tangent": 'np.moveaxis(_as_tangent("tangent_input", tangent_input, saved, '
                                 'saved.output_shape), d, 0)',
              "forward_doc": "the scatter_reduce of src into input along DIM"},
    "fill": {"layout_partial": "host/_segment_fill.py.jinja", "dim": "0",
             "returns": "(_placed(grad_src, saved.src_shape, d), None)",
             "grads_doc": "grad_data, None",
             "initial_tangent": "np.zeros(saved.output_shape, dtype=saved.dtype)",
             "forward_doc": "each segment's extremum of data's rows, FILL where empty"},
}
# CSR offsets (segment_max_csr: torch_scatter's indptr) segment as a fill does, laid out from indptr
SEGMENT_INITIAL["csr"] = SEGMENT_INITIAL["fill"] | {
    "layout_partial": "host/_segment_csr.py.jinja",
    "forward_doc": "each segment's extremum of src's rows indptr[j]:indptr[j + 1], FILL where empty"}


def refuse_start(op, rule, backend: str) -> None:
    """The pyg preset (lower.SegmentRule.beats_start: torch_scatter's scan start) is built by the
    NumPy backend only: a ValueError elsewhere."""
    if rule.beats_start:
        raise ValueError(f"{op.name}: the {backend} backend does not build convention='pyg' "
                         f"(torch_scatter's rule); use backend='numpy'")


def start_context(rule, extremum: str, layout: str, winner: str = "winner") -> dict:
    """The pyg preset's strings (lower.SegmentRule.beats_start: torch_scatter's scan start and the
    output of a segment no element beats), the NumPy module's and the cpu loader's (partial
    host/_segment_start; winner: the name of forward's winners); empty lists otherwise."""
    if not rule.beats_start:
        return {"start_partials": [], "start_lines": [], "unbeaten_call": []}
    big = extremum == "max"
    start = f"np.finfo(lay.src.dtype).{'min' if big else 'max'}"
    unbeaten = (["out[none] = 0"] if layout != "csr" else
                ["empty = np.broadcast_to((np.bincount(lay.key, minlength=out.shape[0]) == 0)[:, None], out.shape)",
                 f"out[none] = np.where(empty, 0, {start.replace('lay.src', 'out')})[none]"])
    return {"start_partials": ["host/_segment_start.py.jinja"], "start_lines": ["lay = _beating(lay)"],
            "unbeaten_call": [f"out, {winner} = _unbeaten(out, {winner}, lay)"],
            "start": start, "beats": ">" if big else "<",
            "start_doc": "lowest finite value" if big else "largest finite value",
            "never_doc": "-inf, the lowest value" if big else "+inf, the largest value",
            "unbeaten_doc": ("0" if layout != "csr" else "0 where the segment is empty, else the start"),
            "unbeaten_lines": unbeaten}


def layout_of(op, rule) -> str:
    """The key of the op's layout partial: "csr" where an indptr gives the segments, else the
    initial element's (lower.SegmentRule.initial: "input" or "fill")."""
    return "csr" if "indptr" in op.spec.inputs else rule.initial


# ----------------------------------------------------------------------------- framework modules
# What the torch and jax backends' segment modules share (their templates <backend>/segment.py.jinja
# and its partials): the element each segment's output is, and the strings naming the op's inputs.
# ``lib`` is the array module's name in the module ("torch" or "jnp").

# the element each segment's output (and a scan's winner) is, among its hits
_FRAMEWORK_PICK_DOCS = {"first": "first hit", "second": "last hit",
                        "ordered": "first hit that is +0 where the extremum is a zero (-0 below +0), "
                                   "else its first hit"}


def framework_pick(pick: str, extremum: str, lib: str, rule) -> dict:
    """_picked's lines and docstring: the first or last hit, or under the zeros rule 'ordered'
    the first +0 (max; min: -0) among them, else the first; and _segments's lines that form the
    output from it (output_lines).  Where the extremum is NaN the output is the segment's winning
    NaN (lower.SegmentRule.nan_last: its last NaN in index order, else its first), bits and all,
    found by index (the framework's scatter returns a NaN by its order of updates: PyTorch's CPU
    loop its last, its GPU atomics and XLA any).  Where the hit holds no NaN (a preset's equality),
    the pick takes the NaNs in: a segment holds hits or NaNs, never both, so one integer scatter
    finds either (the first hit, else the first NaN; or the first hit, else the last NaN: a NaN e
    as ~e = -1 - e, the least of which is the last)."""
    pick = "second" if pick == "last" else pick  # (a scan's order: first or last)
    sign = f"~{lib}.signbit({{}})" if extremum == "max" else f"{lib}.signbit({{}})"
    nan_initial = f"lay.taking & {lib}.isnan(lay.initial)"
    first = "_first_hit(hit_src, hit_initial, lay.key)"
    if not rule.nan_picked and not rule.nan_last:  # the first hit, else the first NaN
        first = (f"_first_hit(hit_src | {lib}.isnan(lay.src), hit_initial | ({nan_initial}), lay.key)  "
                 "# (the first NaN where the segment holds one)")
    ordered = [f"first = {first}",
               f"preferred = _first_hit(hit_src & {sign.format('lay.src')}, "
               f"hit_initial & {sign.format('lay.initial')}, lay.key)",
               f"return {lib}.where(preferred != -2, preferred, first)"]
    lines = {"first": [f"return {first}"], "second": ["return _last_hit(hit_src, hit_initial, lay.key)"]}.get(pick, ordered)
    if not rule.nan_picked and rule.nan_last and pick == "first":  # the first hit, else the last NaN
        # eager PyTorch runs each operation as a pass of its own, so its positions are int32 where
        # they fit (half the bytes of int64) and a NaN's ~e is written over them in place: 17 bytes
        # written an element, the first hit's pick 16, where -2 - e in int64 wrote 33 (scatter_max
        # 100000x16 into 1000 segments, forward, one thread: 38.8-74.0 -> 26.3-45.3 ms, the first
        # hit's pick alone 22.5-55.6, at load 4.4-4.6); JAX's positions are its default integers
        if lib == "torch":
            pos = "torch.arange(n, dtype=torch.int32 if n < 2**31 else torch.int64, device=lay.key.device)"
            nan_at = "pos.bitwise_not_()"
            least = ("torch.full(hit_initial.shape, n, dtype=pos.dtype, device=lay.key.device)"
                     ".scatter_reduce(0, lay.key, at, \"amin\").to(torch.int64)")
        else:
            pos, nan_at = "jnp.arange(n)", "~pos"
            least = "jnp.full(hit_initial.shape, n, dtype=at.dtype).at[lay.key].min(at)"
        lines = ["n = hit_src.shape[0]",
                 f"pos = {pos}",
                 f"at = {lib}.where(hit_src, pos, n)",
                 f"at = {lib}.where({lib}.isnan(lay.src), {nan_at}, at)  "
                 "# a NaN e as ~e = -1 - e: the least is the last NaN",
                 f"least = {least}",
                 f"return {lib}.where(least < 0, ~least, {lib}.where(hit_initial | ({nan_initial}), -1, "
                 f"{lib}.where(least < n, least, -2)))"]
    elif not rule.nan_picked and not (pick in ("first", "ordered") and not rule.nan_last):
        raise ValueError(f"segment: no pick of the winning NaN for zeros {pick!r}, nan_last={rule.nan_last}")
    doc = _FRAMEWORK_PICK_DOCS[pick] + (f"; where the extremum is NaN, its {'last' if rule.nan_last else 'first'} "
                                        "NaN")
    return {"pick_lines": lines, "pick_doc": doc,
            "output_lines": ["out = _at(lay.src, picked, lay.initial)"]}


def framework_names(op, rule) -> dict:
    """The op's inputs, parameters and gradients, and its fill (lower.SegmentRule), in the
    framework module's strings."""
    inputs = op.spec.inputs
    floats = [n for n in inputs if n not in op.spec.constant_inputs]
    names = SEGMENT_INITIAL[layout_of(op, rule)]
    return {
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "wrt_tuple": repr(tuple(floats)),
        "forward_params": ", ".join(inputs), "forward_args": ", ".join(inputs),
        "jvp_params": ", ".join(f"tangent_{n}" for n in inputs),
        "jvp_args": ", ".join(f"tangent_{n}" for n in inputs),
        "index_name": next(n for n in inputs if n in op.spec.constant_inputs),
        "src_name": floats[-1],
        "returns": names["returns"], "grads_doc": names["grads_doc"], "forward_doc": names["forward_doc"],
        "fill": {"-inf": "-math.inf", "inf": "math.inf"}[rule.fill],
    }



def framework_start(op, rule, extremum: str, lib: str, folder: str, empty: str) -> dict:
    """The pyg preset's strings in a framework module (lower.SegmentRule.beats_start:
    torch_scatter's scan start, which an element must beat strictly, and the output of a segment
    none beats; <folder>/_segment_start.py.jinja), empty lists otherwise.  ``lib``: the array
    module's name ("torch" or "jnp"); ``empty``: its expression of the output elements no src
    element reaches (csr: an empty segment)."""
    if not rule.beats_start:
        return {"start_partials": [], "start_lines": [], "unbeaten_call": []}
    big = extremum == "max"
    csr = layout_of(op, rule) == "csr"
    start = f"{lib}.finfo(lay.src.dtype).{'min' if big else 'max'}"
    return {"start_partials": [f"{folder}/_segment_start.py.jinja"], "start_lines": ["lay = _beating(lay)"],
            "unbeaten_call": ["out, picked = _unbeaten(out, picked, lay)"],
            "start": start, "beats": ">" if big else "<",
            "start_doc": "lowest finite value" if big else "largest finite value",
            "never_doc": "-inf, the lowest value" if big else "+inf, the largest value",
            "unbeaten_doc": "0" if not csr else "0 where the segment is empty, else the start",
            "unbeaten_lines": ([f"out = {lib}.where(none, 0, out)"] if not csr else
                               [f"empty = {empty}",
                                f"out = {lib}.where(none & empty, 0, {lib}.where(none, {start}, out))"])}
