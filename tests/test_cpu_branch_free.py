"""The cpu backend's selection functions that read one element each (sg_hit, sg_weight), and max
pooling's fold (sg_combine, both forms), are printed without a conditional: no
?:, no short-circuit || or &&, which GCC compiles to jumps on the data's comparisons (mispredicted
as often as the data decides: max_pool2d split's backward at 64x16x8x8 float32 took 300-360 us on
inputs that change between calls branched, 82 us branch-free).  The folds along a window of the
other kinds and the scan form's sg_take keep their branches; the scan form's forward takes the
row pass on every row, its fold's update a select of bits (backends/cpu/__init__.py's
_selection says why).  Oracle: the text of each rendered .c between its selection
banner and the next; that the printed selects keep the NumPy module's bits is what
tests/test_cpu.py and tests/test_cpu_kinds.py check (tie-heavy inputs with NaN, +-0, +-inf).
No compiler needed: only rendering."""

from __future__ import annotations

import re

import pytest

from symgrad import backends
from symgrad.ops import resolve
from symgrad.pipeline import render

# a kind each of the mask form (sg_hit, sg_weight): max pooling under split (counted) and all, its
# NaN rule each (other conditions), a reduction, adaptive pooling, maxout
CASES = [
    ("max_pool2d", {"kernel_size": 2}, {"ties": "split"}),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, {"ties": "all"}),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, {"ties": "split", "nan": "each"}),
    ("amax", {"dim": 1}, {"ties": "split"}),
    ("adaptive_max_pool2d", {"output_size": (3, 4)}, {"ties": "split"}),
    ("maxout", {"pieces": 3}, {"ties": "split"}),
    # max pooling's scan form (its fold branch-free; sg_take keeps its branches): first, the jax
    # preset (whose output is the fold), a large padded window
    ("max_pool2d", {"kernel_size": 2}, {"ties": "first"}),
    ("max_pool2d", {"kernel_size": 2}, {"convention": "jax"}),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, {"convention": "jax"}),
]
# the scan form's cases: max pooling whose forward folds along each window in the row pass
SCAN_CASES = [c for c in CASES if c[0] == "max_pool2d" and c[2].get("ties") in (None, "first", "last")]


def _selection_functions(source: str) -> dict:
    """{name: body} of the .c's selection functions (float and double), from its selection
    banner to the next banner."""
    match = re.search(r"// -+ the selection\n(.*?)\n// -+ ", source, re.S)
    assert match, "no selection block in the rendered source"
    found = dict(re.findall(r"SG_INLINE \w+ (sg_\w+)\(.*?\) \{\n(.*?)\n\}", match.group(1), re.S))
    assert found, "no selection function found"
    return found


def _source(op, params, settings) -> str:
    spec = resolve(op, **settings, **params)
    (source,) = [v for k, v in render(spec, backends.get("cpu")).items() if k.endswith(".c")]
    return source


def _conditional(body: str) -> bool:
    return "?" in body or "||" in body or "&&" in body


@pytest.mark.parametrize("op,params,settings", CASES,
                         ids=[f"{op}-{'-'.join(map(str, s.values()))}" for op, _, s in CASES])
def test_selection_functions_have_no_conditional(op, params, settings):
    functions = _selection_functions(_source(op, params, settings))
    pool = op.startswith("max_pool")
    mask = "sg_hit_float" in functions
    branch_free = [n for n in functions if n.startswith(("sg_hit_", "sg_weight_"))
                   or (pool and n.startswith("sg_combine_"))]
    # float and double each: sg_hit and sg_weight (mask form), sg_combine (max pooling)
    assert len(branch_free) == 2 * (2 * mask + pool), sorted(functions)
    conditional = [f"{n}: {functions[n].strip()}" for n in branch_free if _conditional(functions[n])]
    assert not conditional, "\n".join(conditional)



@pytest.mark.parametrize("op,params,settings", SCAN_CASES,
                         ids=[f"{op}-{'-'.join(map(str, s.values()))}" for op, _, s in SCAN_CASES])
def test_scan_pool_forward_folds_row_by_row_without_a_conditional(op, params, settings):
    """Max pooling's scan-form forward: every row through the row pass (no window-by-window path
    for short rows, whose selects GCC compiled to jumps: 64x16x8x8 float32 first forward 230-270
    us on inputs that change between calls, 110-120 us through the row pass), and its fold's update
    a select of bits (sg_pick), no ?: (the jax preset's 64x16x8x8 forward 260 -> 123 us)."""
    source = _source(op, params, settings)
    kernels = re.split(r"// -+ kernels\n", source, maxsplit=1)[1]
    folds = re.findall(r"^\s*if \(!WINNER_IS_OUTPUT\) (fold\S* = .*);$", kernels, re.M)
    assert len(folds) >= 4, folds  # the edges and the rows inside, per data type
    conditional = [f for f in folds if _conditional(f)]
    assert not conditional, "\n".join(conditional)
    assert "window by window" not in kernels and "w <= 8" not in kernels
