"""The cpu backend's segment kernels (windows given by an index: scatter_max, segment_max):
segment.c.jinja (forward serial, two passes over the rows in the NumPy module's order; backward a
gather) and loader_segment.py.jinja (the NumPy module's layout partials from host/, its Saved
field for field)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lower import WindowKernel
from ..cfamily.segment import PICK_DOCS, rounds_apart_in_float16
from ..host import host_partials
from ..host.segment import SEGMENT_INITIAL, layout_of, start_context
from .printer import c_code

if TYPE_CHECKING:
    from ...lower import Artifacts

# what a src hit (row e, column col) does to the saved winner or count (kept) and the output row
# (row), by the element the output is; the output stays the extremum where it is NaN
_TAKES = "if (!sg_isnan(er[col])) row[col] = sr[col];"
_HIT_LINES = {  # (formats: load the dtype's, takes _TAKES)
    ("scan", "first"): ["if (kept[col] == -2) {{ kept[col] = e; {takes} }}"],
    ("scan", "second"): ["kept[col] = e;", "{takes}"],
    ("mask", "first"): ["if (kept[col] == 0) {takes}", "kept[col] += 1;"],
    ("mask", "second"): ["{takes}", "kept[col] += 1;"],
    ("mask", "ordered"): ["if (kept[col] == 0 || (PREFERRED({load}(sr[col])) && !PREFERRED({load}(row[col])))) {takes}",
                          "kept[col] += 1;"],
}


def _reads(scan: bool, ctype: str) -> str:
    """What backward and jvp read, as the kernels' parameters (after grad_output or the tangents)."""
    arrays = ([("int64_t", "key"), ("int64_t", "winner")] if scan else
              [("int64_t", "key"), ("uint8_t", "taking"), (ctype, "src"), (ctype, "initial"),
               (ctype, "output"), ("int64_t", "count")])
    return "".join(f"const {t}* restrict {name}, " for t, name in arrays)


def _gradients(scan: bool, dt: dict, count_arg: str) -> tuple[str, str]:
    """(a src element's gradient, an initial element's) in the compute type, at output o."""
    load, a = f"sg_load_{dt['name']}", dt["acc"]
    g = f"{load}(grad_output[o])"
    if scan:
        return f"winner[o] == e ? {g} : ({a})0", f"winner[o] == -1 ? {g} : ({a})0"
    weight = f"sg_weight_{a}({g}, {load}({{}}), {load}(output[o]){count_arg})"
    return weight.format("src[e * C + c]"), f"taking[j] ? {weight.format('initial[o]')} : ({a})0"


def _saves(kernel: WindowKernel, dt: dict) -> list[str]:
    """forward's last lines per output o (none but under a framework's rule): the initial element
    counted where it takes no part."""
    if kernel.selection.form == "scan" or not kernel.segment.count_initial:
        return []
    load = f"sg_load_{dt['name']}"
    return [f"saved[o] += !taking[j] && sg_hit_{dt['acc']}({load}(initial[o]), {load}(out[o]));"
            "  // the initial element counted where it takes no part (the framework's count)"]


def segment_context(art: Artifacts, base: dict, selection: tuple, dtypes: list[dict]) -> dict:
    """The .c source's and loader's finished strings, over the backend's base context (base) and
    printed selection (selection: _selection's docs and functions, to which the hit is added)."""
    op, kernel = art.op, art.kernel
    sel, rule = kernel.selection, kernel.segment
    scan = sel.form == "scan"
    docs, real_types = selection
    if scan:  # the mask's selection has the hit; a scan's winner is a hit too
        docs = docs + ["sg_hit(v, extremum): an element attains its segment's extremum"]
        for rt in real_types:
            rt["functions"].append({"ret": "bool", "name": f"sg_hit_{rt['name']}",
                                    "params": f"const {rt['name']} v, const {rt['name']} extremum",
                                    "body": [f"return {c_code(rule.hit, rt['name'])};"]})
    pick = sel.order if scan else rule.zeros
    pick = {"last": "second"}.get(pick, pick)
    sign = "!signbit(v)" if sel.extremum == "max" else "signbit(v)"
    count_arg = {dt["name"]: (f", ({dt['acc']})count[o]" if sel.counts else "") for dt in dtypes}
    grads = {dt["name"]: _gradients(scan, dt, count_arg[dt["name"]]) for dt in dtypes}
    inputs = op.spec.inputs
    index_name = next(n for n in inputs if n in op.spec.constant_inputs)
    return base | SEGMENT_INITIAL[layout_of(op, rule)] | host_partials(kernel) | start_context(
            rule, sel.extremum, layout_of(op, rule), "kept") | {
        "template": "cpu/segment.c.jinja", "loader_template": "cpu/loader_segment.py.jinja",
        "selection_doc": docs, "real_types": real_types, "scan": scan,
        "constants": [f"#define PREFERRED(v) ({sign})  // the preferred sign of a tied zero ('ordered' zeros rule)"],
        "hit_lines": {dt["name"]: [line.format(load=f"sg_load_{dt['name']}", takes=_TAKES)
                                   for line in _HIT_LINES[sel.form, pick]] for dt in dtypes},
        "initial_saved": "hit ? -1 : -2" if scan else "hit", "pick_doc": PICK_DOCS[pick],
        "saves": {dt["name"]: _saves(kernel, dt) for dt in dtypes},
        "saved_doc": ("each segment's winner per column (-2 none, -1 its initial element, e >= 0 src row e)"
                      if scan else "each segment's count of hits per column"),
        "gather_doc": "winner" if scan else "output and count",
        "jvp_doc": ("the tangent of each segment's winner" if scan else
                    "each segment's weights applied to the tangents, added in segment order, the initial element first"),
        "reads_doc": _reads(scan, "T").replace("restrict ", ""),
        # (each kernel reads some of them and of the sizes: a scan's jvp no key, the 'all' weight no count)
        "reads_used": " ".join(f"(void){name};" for name in
                               (["key", "winner", "E"] if scan else ["key", "taking", "src", "initial", "output", "count"])),
        "reads": {dt["name"]: _reads(scan, dt["ctype"]) for dt in dtypes}, "count_arg": count_arg,
        "src_gradient": {k: v[0] for k, v in grads.items()}, "initial_gradient": {k: v[1] for k, v in grads.items()},
        "extremum": sel.extremum, "fill": f"np.{rule.fill}".replace("np.-inf", "-np.inf"),
        "index_name": index_name, "src_name": [n for n in inputs if n not in op.spec.constant_inputs][-1],
        "forward_params": ", ".join(inputs),
        "float16_refused": repr(rounds_apart_in_float16(kernel)),
        # a scan's winners in [-2, E) (jvp reads src row winner), in _reads's names
        "winner_check": ("\n            or (arrays[1].size and (arrays[1].min() < -2 or arrays[1].max() >= rows))"
                         if scan else ""),
        # the shapes of the saved arrays after the key, in _reads's names
        "read_shapes": "((k, c),)" if scan else "((k,), (rows, c), (k, c), (k, c), (k, c))",
    }
