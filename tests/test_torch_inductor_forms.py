"""The torch backend's NaN and sign tests in the forms Inductor vectorizes on the CPU.

Inductor's C++ code computes torch.signbit and torch.isnan one element at a time (a scalar loop
inside every vectorized loop), which made the jax preset's relu, max pooling and global adaptive
pooling (-0 below +0: a sign test on every element) the slow part of the compiled CNN step
(benchmarks/frameworks.py).  printer.sign_test and nan_test write them as a compare and a copysign
instead: checked here against torch.signbit/torch.isnan on every special value (the same bits, -0
and negative NaN included), and the jax-preset modules checked to print no scalar-loop test.  The
modules' results stay the NumPy module's bit for bit (test_torch_backend, test_torch_adaptive)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import symgrad  # noqa: E402
from symgrad.backends.torch.printer import nan_test, sign_test  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _specials(dtype) -> torch.Tensor:
    """+-0, +-1, +-inf, NaN of both signs, the smallest subnormals and the largest numbers."""
    info = torch.finfo(dtype)
    values = [0.0, 1.0, math.inf, info.tiny, info.tiny * info.eps, info.max, 2.5]
    v = torch.tensor(values + [-x for x in values], dtype=torch.float64).to(dtype)
    nan = torch.tensor([math.nan], dtype=dtype)
    return torch.cat([v, nan, -nan, torch.copysign(nan, torch.tensor(-1.0, dtype=dtype))])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sign_and_nan_tests_equal_torch_on_every_special_value(dtype):
    v = _specials(dtype)
    assert torch.signbit(v).any() and not torch.signbit(v).all()  # both signs are there
    assert torch.equal(eval(sign_test("v")), torch.signbit(v))
    assert torch.equal(eval(nan_test("v")), torch.isnan(v))
    rows = v.reshape(1, -1)  # a view by constant indices is written twice too
    assert torch.equal(eval(sign_test("rows[..., 0]")), torch.signbit(rows[..., 0]))


def test_anything_but_a_name_keeps_the_torch_call():
    """An expression is not written twice (it would be computed twice eagerly)."""
    assert sign_test("(a + b)") == "torch.signbit((a + b))"
    assert nan_test("(a + b)") == "torch.isnan((a + b))"


# the benchmark CNN's ops under the jax preset (relu, a 2x2 max pool, a global adaptive max pool)
JAX_MODULES = [("relu", {}),
               pytest.param("max_pool2d", {"kernel_size": 2}, marks=pytest.mark.slow),
               pytest.param("adaptive_max_pool2d", {"output_size": 1}, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name,params", JAX_MODULES, ids=["relu", "max_pool2d", "adaptive_max_pool2d"])
def test_jax_preset_modules_print_no_scalar_loop_test(name, params):
    mod = symgrad.load(name, backend="torch", convention="jax", **params)
    with open(mod.__file__) as f:
        code = f.read()
    assert "torch.signbit(" not in code and "torch.isnan(" not in code
    if name == "relu":  # max(0, x) with -0 below +0: a tie with the number 0 returns +0, no sign test;
        # (0 == x) | (0 > x) printed as the one comparison 0 >= x (printing.weak_comparisons)
        assert "copysign" not in code and "torch.where(0 >= x, 0, x)" in code and "0 == x" not in code
    else:  # (the preset does test signs: the fold of two elements)
        assert "copysign" in code


@pytest.mark.parametrize("settings", [{"ties": "split"}, pytest.param({"convention": "jax"}, marks=pytest.mark.slow)],
                         ids=["split", "jax"])
def test_reduction_zero_rule_takes_no_argmax_of_a_boolean_row(settings):
    """amax's zeros rule (plain: the first zero; jax: +0 where the row holds one) finds a row's first
    zero as the least position holding one (an integer min), not Inductor's slow argmax of a
    Boolean row, and tests signs without torch.signbit (compiled forward of a 4096x256 amax:
    5.8 -> 0.57 ms under split)."""
    mod = symgrad.load("amax", backend="torch", dim=-1, **settings)
    with open(mod.__file__) as f:
        code = f.read()
    zero = [line for line in code.splitlines() if line.strip().startswith("zero = ")]
    assert len(zero) == 1
    assert "argmax(" not in zero[0] and "torch.signbit(" not in zero[0]


@pytest.mark.parametrize("name,params", [("amax", {"dim": -1}), ("adaptive_max_pool2d", {"output_size": 1})],
                         ids=["amax", "adaptive_max_pool2d"])
def test_ordered_zero_rule_reduces_signs_without_a_boolean_row(name, params):
    """The jax preset's zeros rule (+0 where the row holds one, -0 below +0) as one float reduction of
    the elements' signs, not a test of (v == 0) & sign over the row (Boolean rows Inductor stored in
    the compiled CNN step's global adaptive pool: one of its two Boolean (4096, 256) buffers).  Bit
    equality with the NumPy module, +-0 and NaN included: test_torch_backend, test_torch_adaptive."""
    mod = symgrad.load(name, backend="torch", convention="jax", **params)
    with open(mod.__file__) as f:
        code = f.read()
    zero = [line.strip() for line in code.splitlines() if line.strip().startswith("zero = ")]
    assert len(zero) == 1
    assert ".any(" not in zero[0] and "== 0" not in zero[0] and "copysign" in zero[0]


def test_an_equality_or_a_strict_comparison_of_the_same_operands_is_printed_as_one_comparison():
    """Or(a == b, a > b) is printed a >= b, Or(a == b, a < b) a <= b (either operand order, any
    place in the OR), by every backend's printer; each printed condition has the OR's truth on
    every pair of special values of the four dtypes (NaN: false; +0 and -0: true)."""
    import itertools

    import sympy as sp

    from symgrad.backends.cpu.printer import c_code
    from symgrad.backends.jax.printer import jax_code
    from symgrad.backends.torch.printer import torch_code

    a, b, c = sp.symbols("a b c")
    eq = sp.Eq(a, b, evaluate=False)
    cases = [(sp.Or(eq, sp.StrictGreaterThan(a, b, evaluate=False), evaluate=False), "a >= b"),
             (sp.Or(sp.StrictLessThan(b, a, evaluate=False), sp.Eq(b, a, evaluate=False), evaluate=False), "b <= a"),
             (sp.Or(sp.StrictGreaterThan(c, 0, evaluate=False), eq, sp.StrictLessThan(a, b, evaluate=False),
                    evaluate=False), None),
             (sp.Or(eq, sp.StrictGreaterThan(a, c, evaluate=False), evaluate=False), None)]  # other operands: kept
    def printed_torch(e):
        return torch_code(e, [])

    for dtype in DTYPES:
        v = _specials(dtype)
        x, y = (torch.tensor(p, dtype=dtype) for p in zip(*itertools.product(v.tolist(), repeat=2)))
        z = torch.zeros_like(x)
        for expr, printed in cases:
            code = printed_torch(expr)
            if printed is not None:
                assert code == printed
            oracle = torch.zeros_like(x, dtype=torch.bool)
            for arg in expr.args:  # each operand printed alone: no join
                oracle = oracle | eval(printed_torch(arg), {"a": x, "b": y, "c": z})
            assert torch.equal(eval(code, {"a": x, "b": y, "c": z}), oracle), (dtype, code)
    assert "==" not in printed_torch(cases[2][0]) and "<=" in printed_torch(cases[2][0])
    assert "==" in printed_torch(cases[3][0])
    assert jax_code(cases[0][0]) == "a >= b" and c_code(cases[0][0], "double") == "a >= b"
