"""The native CPU backend (symgrad/backends/cpu): C kernels compiled on first use, called through
ctypes.  Oracle: the NumPy backend, bit for bit (tests/cuda_harness/check.py's comparison and
tie-heavy inputs with +-0, NaN, +-inf; float16 against NumPy in float32 rounded once), for every
tie policy x NaN rule, both framework presets, float16/32/64, NCHW, channels-last and strided
inputs, several geometries; the same bits with 1 and 2 threads; the compile cache; the errors.

Skipped when no C compiler is found, except under CI=true, where the compiler is required."""

from __future__ import annotations

import os
import shutil
import stat
import sys

import numpy as np
import pytest

import symgrad
from conftest import POLICIES, WINDOWED, case_id
from cuda_harness.check import compare, inputs_for, mismatch
from symgrad.ops import resolve
from symgrad.policy import NAN_RULES
from symgrad.backends import cpu

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
if COMPILER is None and os.environ.get("CI") != "true":
    pytest.skip("no C compiler (cc, gcc, clang or $CC) on this machine: the cpu backend needs one "
                "(required when CI=true)", allow_module_level=True)

LAYOUTS = ("contiguous", "channels_last", "strided")
DTYPES = (np.float64, np.float32, np.float16)
POOLS = [(op, params, shape) for op, params, shape in WINDOWED if op.startswith("max_pool")]
OVERLAP = ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 7, 6))
# every NaN rule with every tie policy it admits
NAN_SETTINGS = [{"ties": t, "nan": n} for n, rule in NAN_RULES.items() for t in rule.policies]


def _problems(op, params, shape, settings, layouts=LAYOUTS, dtypes=DTYPES) -> list[str]:
    """Every comparison of the cpu module with the NumPy module on tie-heavy inputs, without and
    with NaN/+-inf/-0."""
    module = symgrad.load(op, backend="cpu", **settings, **params)
    rng = np.random.default_rng(sum(map(ord, f"{op}{params}{settings}")))
    problems = []
    for specials in (False, True):
        inputs = inputs_for(rng, op, [shape], specials)
        for dtype in dtypes:
            for layout in layouts:
                if layout == "channels_last" and len(shape) != resolve(op, **params).spec.spatial + 2:
                    continue
                problems += compare(np, op, params, settings, inputs, dtype, layout, module=module)
    return problems


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shape", POOLS, ids=[case_id(*c) for c in POOLS])
def test_equals_numpy_bit_for_bit(op, params, shape, ties):
    problems = _problems(op, params, shape, {"ties": ties})
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("settings", NAN_SETTINGS, ids=[f"{s['ties']}-{s['nan']}" for s in NAN_SETTINGS])
def test_equals_numpy_under_every_nan_rule(settings):
    problems = _problems(*OVERLAP, settings)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("convention", ("torch", "jax"))
@pytest.mark.parametrize("op,params,shape", [OVERLAP, POOLS[3]], ids=[case_id(*OVERLAP), case_id(*POOLS[3])])
def test_equals_numpy_under_each_preset(op, params, shape, convention):
    """A preset's NaN rule and padding (JAX: -inf that takes part) reach the C kernels."""
    problems = _problems(op, params, shape, {"convention": convention})
    assert not problems, "\n".join(problems[:10])
