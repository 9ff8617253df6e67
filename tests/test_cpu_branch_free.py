"""The cpu backend's selection functions (sg_combine, sg_take, sg_hit, sg_weight: one call per
window element, on the data's comparisons) are printed without a conditional: no ?:, no
short-circuit || or &&, which GCC compiles to jumps on the comparisons (mispredicted as often as
the data decides: max_pool2d split's backward at 64x16x8x8 float32 took 250-300 us in a training
step branched, 73 us branch-free).  Oracle: the text of each rendered .c between its selection
banner and the next; that the printed selects keep the NumPy module's bits is what
tests/test_cpu.py and tests/test_cpu_kinds.py check (tie-heavy inputs with NaN, +-0, +-inf).
No compiler needed: only rendering."""

from __future__ import annotations

import re

import pytest

from symgrad import backends
from symgrad.ops import resolve
from symgrad.pipeline import render

# a kind each: pooling's mask form (split) and scan form (first), under the presets too (their
# NaN rules and zeros rules print other conditions), a reduction, adaptive pooling, maxout
CASES = [
    ("max_pool2d", {"kernel_size": 2}, {"ties": "split"}),
    ("max_pool2d", {"kernel_size": 2}, {"ties": "first"}),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, {"ties": "all"}),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, {"convention": "torch"}),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, {"convention": "jax"}),
    ("amax", {"dim": 1}, {"ties": "split"}),
    ("adaptive_max_pool2d", {"output_size": (3, 4)}, {"ties": "split"}),
    ("maxout", {"pieces": 3}, {"ties": "last"}),
]


def _selection_block(source: str) -> str:
    """The .c's selection functions: from the selection banner to the next banner."""
    match = re.search(r"// -+ the selection\n(.*?)\n// -+ ", source, re.S)
    assert match, "no selection block in the rendered source"
    return match.group(1)


@pytest.mark.parametrize("op,params,settings", CASES,
                         ids=[f"{op}-{'-'.join(map(str, s.values()))}" for op, _, s in CASES])
def test_selection_functions_have_no_conditional(op, params, settings):
    spec = resolve(op, **settings, **params)
    (source,) = [v for k, v in render(spec, backends.get("cpu")).items() if k.endswith(".c")]
    code = [line for line in _selection_block(source).splitlines() if not line.lstrip().startswith(("//", "#"))]
    assert any(line.startswith("SG_INLINE") for line in code), "no selection function found"
    conditional = [line.strip() for line in code if "?" in line or "||" in line or "&&" in line]
    assert not conditional, "\n".join(conditional)
