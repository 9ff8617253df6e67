"""Expression mode shares common subexpressions (symgrad.lower.share_common).

* The done-when module (gated, split): the count denominator and `x + y` are computed once in
  the backward, in NumPy and in each CUDA compute type; shared conditions are bool in CUDA.
* Sharing names values, it does not change them: the backward plan with temporaries and the
  plan without (``share=False``) are both executed here, statement by statement, and agree bit
  for bit (any NaN equal to any NaN, as in tests/cuda_harness) on tie-heavy inputs with NaN, +-inf and -0 (sums and products of three or more
  operands keep their order).
* Every temporary is read at least twice, also when ``wrt`` prunes the backward; temporaries
  never take an input's name (inputs named like temporaries give the same bits as x, y).
* The CUDA kernels with temporaries (declared bool or in the compute type, some between the
  gradients) run on the CPU through tests/cuda_harness and match the NumPy module bit for bit.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import symgrad
from symgrad.derive import derive
from symgrad.expr import make_op
from symgrad.lower import backward_plan, lower_expression
from symgrad.backends.host.printer import numpy_code

import cuda_harness as harness
from cuda_harness.check import mismatch

N_EXPRS = int(os.environ.get("SYMGRAD_CSE_EXPRS", "12"))

EXPRS = [
    "Max(x*y, x + y, 0)",
    "Max(2*x - y + 1, -x + 3*y, 0.5*x + 0.5*y - 2)",
    "Min(Max(x - y, -1), 1)**2 + 0.1*Abs(x)",
    "Max(x + y, 0)*exp(x + y)",
    "Max(Min(x, y), Abs(x - y) - 1, exp(x) - 2)",
    "Max(x - y, y - x, 2*x*y, x*y*x - 3)*(x - y)**2 + Min(x - y, 1)*3*x*y",
    "Max(x*y*2 + x + y, x - y + 1, 0)*Abs(x + y) + Max(x, y)*Min(x, y)*(x + y)",
    "Min(x*x - y, y*y - x, x + y + 1, 0.5)*relu(x - y)*relu(y - x + 1)",
    "Heaviside(x)*y + sign(y)*x + Heaviside(y, 0.25)",
    "Piecewise((x*y, x < 1), (2*x - 1, x <= 2), (y, True)) + Abs(x*y - 1)",
    "Max(Max(x, y), Min(x, y) + 1, x*y)**3 + Abs(Max(x, y) - 1)",
    "Abs(x - y) + x*sigmoid(y) + Max(x - y, 0)",
][:N_EXPRS]


def _backward(source: str) -> str:
    """The backward's arithmetic: from _gradients (called by backward, chunk by chunk) on."""
    return source[source.index("def _gradients"):]


def test_gated_split_computes_the_count_and_x_plus_y_once(tmp_path):
    path = symgrad.generate_expr("Max(x*y, x + y, 0)", tmp_path, name="gated", ties="split")
    back = _backward(path.read_text())
    assert back.count("np.add(") == 2  # the one count: ((a + b) + c), in the working dtype
    assert back.count("x + y") == 1
    assert len(re.findall(r"\bcount0\b", back)) == 3  # assigned once, read by both gradients
    symgrad.generate_expr("Max(x*y, x + y, 0)", tmp_path, name="gated", ties="split", backend="cuda")
    cu = (tmp_path / "gated_split.cu").read_text()
    for rt in ("float", "double"):
        body = cu[cu.index(f"void sg_gradients(const {rt} grad_output"):]
        body = body[:body.index("\n}\n")]
        assert body.count(f"({rt})(") == 3  # the count's three conditions, added once
        assert body.count("sg_in_x + sg_in_y") == 1  # the inputs as the .cu spells them
        assert re.search(r"const bool cond0 = ", body) and re.search(rf"const {rt} count0 = ", body)


def _run(assigns, env):
    ns = dict(env)
    with np.errstate(all="ignore"):
        for a in assigns:
            ns[a.name] = eval(numpy_code(a.expr), ns)  # noqa: S307 (printed by symgrad here)
    return ns


def _inputs(rng, dtype):
    x = rng.integers(-4, 5, size=(5, 8)).astype(np.float64) / 2
    y = rng.integers(-4, 5, size=(8,)).astype(np.float64) / 2
    for a in (x, y):
        flat = a.reshape(-1)
        where = rng.random(flat.size) < 0.2
        flat[where] = rng.choice([np.nan, np.inf, -np.inf, -0.0], size=int(where.sum()))
    x[0] = rng.normal(size=8)
    return x.astype(dtype), y.astype(dtype)


@pytest.mark.parametrize("ties", ["first", "split"])
@pytest.mark.parametrize("expr", EXPRS)
def test_shared_backward_is_bit_identical_to_the_unshared_one(expr, ties):
    op, _ = make_op(expr, inputs=("x", "y"), ties=ties)
    kernel = lower_expression(derive(op))
    shared = backward_plan(kernel, ("x", "y"))
    plain = backward_plan(kernel, ("x", "y"), share=False)
    rng = np.random.default_rng(7)
    for dtype in (np.float64, np.float32):
        x, y = _inputs(rng, dtype)
        g = rng.integers(-3, 4, size=(5, 8)).astype(dtype)
        env = {"np": np, "dtype": np.dtype(dtype), "x": x, "y": y, "grad_output": g}
        a = _run([s for part in shared for s in part], env)
        b = _run([s for part in plain for s in part], env)
        for name in ("grad_x", "grad_y"):
            va, vb = np.broadcast_to(a[name], g.shape), np.broadcast_to(b[name], g.shape)
            assert mismatch(va, vb) == "", (expr, ties, dtype, name)  # bit for bit; NaN is NaN


@pytest.mark.parametrize("wrt", [("x", "y"), ("x",), ("y",)])
@pytest.mark.parametrize("expr", EXPRS[:6])
def test_every_temporary_is_read_twice(expr, wrt):
    op, _ = make_op(expr, inputs=("x", "y"), wrt=wrt, ties="split")
    kernel = lower_expression(derive(op))
    statements = [s for part in backward_plan(kernel, wrt) for s in part]
    names = {s.name for s in kernel.intermediates + kernel.adjoints + kernel.grads}
    temps = [s.name for s in statements if s.name not in names]
    code = "\n".join(numpy_code(s.expr) for s in statements)
    for t in temps:
        assert len(re.findall(rf"\b{t}\b", code)) >= 2, (expr, wrt, t)
    assert {s.name for s in statements if s.name.startswith("grad_")} == {f"grad_{v}" for v in wrt}


def test_inputs_named_like_temporaries_keep_their_names(tmp_path):
    plain = symgrad.load_expr("Max(x*y, x + y, 0)", ties="split")
    clash = symgrad.load_expr("Max(t0*cond0, t0 + cond0, 0)", inputs=("t0", "cond0"), ties="split")
    back = _backward(Path(clash.__file__).read_text())
    assigned = re.findall(r"^\s+(\w+) = ", back, re.M)
    # the inputs are _gradients' parameters, never assigned to
    assert "t0" not in assigned and "cond0" not in assigned
    assert back.startswith("def _gradients(grad_output: np.ndarray, t0: np.ndarray, cond0: np.ndarray,")
    assert "t1" in assigned and "cond1" in assigned  # the temporaries took the next names
    rng = np.random.default_rng(5)
    x, y = _inputs(rng, np.float64)
    g = rng.normal(size=(5, 8))
    with np.errstate(invalid="ignore"):  # the special inputs make inf * 0: NaN, as intended
        out_a, sa = plain.forward(x, y)
        out_b, sb = clash.forward(x, y)
    assert out_a.tobytes() == out_b.tobytes()
    for a, b in zip(plain.backward(g, sa), clash.backward(g, sb)):
        assert a.tobytes() == b.tobytes()


# the CUDA kernels run on the CPU (tests/cuda_harness): temporaries between the gradients (the
# first of these puts some after grad_x), bool temporaries, a gradient read by the next one
CUDA_EXPRS = [("Min(2*x, x + y, y - 1)", "all"), ("Max(x + y, 0)*exp(x + y)", "first"),
              ("Max(x*y, x + y, 0)", "split")]


@pytest.fixture(scope="module")
def cupy_on_cpu(tmp_path_factory):
    if harness.find_cxx() is None:
        pytest.skip("no C++ compiler: the CPU execution harness needs one")
    return harness.fake_cupy(tmp_path_factory.mktemp("cse-cuda-host"))


@pytest.mark.parametrize("expr,ties", CUDA_EXPRS)
def test_cuda_kernels_with_temporaries_match_the_numpy_module(expr, ties, cupy_on_cpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", cupy_on_cpu)
    ref = symgrad.load_expr(expr, ties=ties, inputs=("x", "y"))
    dev = symgrad.load_expr(expr, ties=ties, inputs=("x", "y"), backend="cuda")
    cu = next(Path(dev.__file__).parent.glob("*.cu")).read_text()
    assert re.search(r"const (float|double|bool) (t|cond|isnan|cmp|count)\d+ = ", cu)
    rng = np.random.default_rng(9)
    for dtype in (np.float64, np.float32):
        x, y = _inputs(rng, dtype)
        y = np.broadcast_to(y, x.shape).copy()
        g = rng.integers(-3, 4, size=x.shape).astype(dtype)
        with np.errstate(invalid="ignore"):  # the special inputs make inf * 0: NaN, as intended
            out_ref, saved_ref = ref.forward(x, y)
        out, saved = dev.forward(x, y)
        pairs = [(out, out_ref)] + list(zip(dev.backward(g, saved), ref.backward(g, saved_ref)))
        for a, b in pairs:
            if "exp" in expr:  # exp: NumPy's and the C library's may differ in the last place
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=0, equal_nan=True)
            else:
                assert mismatch(a, b) == "", (expr, ties, dtype)
