"""The cpu backend's selection functions that read one element each (sg_hit, sg_weight), and max
pooling's mask-form fold (sg_combine under split and all), are printed without a conditional: no
?:, no short-circuit || or &&, which GCC compiles to jumps on the data's comparisons (mispredicted
as often as the data decides: max_pool2d split's backward at 64x16x8x8 float32 took 300-360 us on
inputs that change between calls branched, 82 us branch-free).  The folds along a window of the
other kinds and the scan form's sg_take keep their branches (backends/cpu/__init__.py's
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
]


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
    mask_pool = op.startswith("max_pool") and "sg_hit_float" in functions
    branch_free = [n for n in functions if n.startswith(("sg_hit_", "sg_weight_"))
                   or (mask_pool and n.startswith("sg_combine_"))]
    assert len(branch_free) >= (6 if mask_pool else 4), sorted(functions)  # float and double each
    conditional = [f"{n}: {functions[n].strip()}" for n in branch_free if _conditional(functions[n])]
    assert not conditional, "\n".join(conditional)

