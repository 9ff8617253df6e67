"""hinge_embedding_loss (issue 30): [t != 1] max(0, margin - x) + [t != -1] x, composed of
margin_ranking_loss's generated module (symgrad/hinge.py).

Oracles: PyTorch 2.13's F.hinge_embedding_loss and the expression a JAX user writes
(jnp.where(t != 1, jnp.maximum(0, margin - x), 0) + jnp.where(t != -1, x, 0); optax has no
hinge embedding loss) on the CPU, bit for bit (signs of zero included, NaN where NaN) in
float64/32/16 and bfloat16, on every combination of -inf, -1, -0.5, +-0, 0.3, 0.5, 1, 2, +inf, NaN
(x = margin: the kink), targets +-1, 0.5, 0, 2, NaN and grad_output 1, -0.5, +-0, inf; the
reductions; a brute-force loop from the definition under every policy; finite differences;
symgrad.check, which catches a planted wrong kink value.
"""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest

import symgrad
from symgrad.policy import POLICIES
from conftest import assert_same_values

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.float64, np.float32, np.float16, BF16]
VALUES = [-np.inf, -1.0, -0.5, -0.0, 0.0, 0.3, 0.5, 1.0, 2.0, np.inf, np.nan]
TARGETS = [1.0, -1.0, 0.5, 0.0, 2.0, np.nan]
GRADS = [1.0, -0.5, 0.0, -0.0, np.inf]
SLOW = pytest.mark.slow


def _grid(dtype):
    x, t, g = np.array(list(itertools.product(VALUES, TARGETS, GRADS))).T
    return x.astype(dtype), t.astype(dtype), g.astype(dtype)


def _torch_dtype(dtype):
    return torch.bfloat16 if dtype == BF16 else getattr(torch, np.dtype(dtype).name)


def _torch(x, t, g, margin, reduction="none"):
    dt = _torch_dtype(x.dtype)
    tx = torch.tensor(x.astype(np.float64)).to(dt).requires_grad_()
    y = F.hinge_embedding_loss(tx, torch.tensor(t.astype(np.float64)).to(dt), margin=margin,
                               reduction=reduction)
    (gx,) = torch.autograd.grad(y, tx, torch.tensor(np.asarray(g, np.float64)).to(dt))
    back = lambda v: v.detach().to(torch.float64).numpy().astype(x.dtype)  # noqa: E731 (exact)
    return back(y), back(gx)


def _jax_loss(margin, reduction="none"):
    def loss(x, t):  # as a JAX user writes F.hinge_embedding_loss
        y = jnp.where(t != 1, jnp.maximum(0, margin - x), 0) + jnp.where(t != -1, x, 0)
        return y if reduction == "none" else getattr(jnp, reduction)(y)
    return loss


def _jax(x, t, g, margin, reduction="none"):
    dt = jnp.bfloat16 if x.dtype == BF16 else x.dtype
    y, pullback = jax.vjp(lambda v: _jax_loss(margin, reduction)(v, jnp.asarray(t, dt)),
                          jnp.asarray(x, dt))
    return np.asarray(y).astype(x.dtype), np.asarray(pullback(jnp.asarray(g, dt))[0]).astype(x.dtype)


def _ours(module, x, t, g):
    y, saved = module.forward(x, t)
    gx, gt = module.backward(g, saved)
    assert gt is None  # the target only selects: no gradient, as in PyTorch
    return y, gx


def _variants():
    for convention in ("torch", "jax"):
        for dtype in DTYPES:
            for margin in (1.0, 0.3, 0.0, -0.5):
                name = np.dtype(dtype).name
                default = (convention, name, margin) in (("torch", "float32", 1.0), ("jax", "float16", 0.3))
                yield pytest.param(convention, dtype, margin, marks=() if default else (SLOW,),
                                   id=f"{convention}-{name}-margin{margin}")


@pytest.mark.parametrize("convention,dtype,margin", list(_variants()))
def test_presets_equal_the_frameworks_bit_for_bit(convention, dtype, margin):
    module = symgrad.load("hinge_embedding_loss", convention=convention, margin=margin)
    x, t, g = _grid(dtype)
    want = (_torch if convention == "torch" else _jax)(x, t, g, margin)
    got = _ours(module, x, t, g)
    for what, a, b in zip(("forward", "grad input"), got, want):
        assert_same_values(a, b, f"{convention} {np.dtype(dtype).name} margin={margin} {what}")


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=SLOW),
                                   pytest.param(np.float16, marks=SLOW), pytest.param(BF16, marks=SLOW)],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reduction", ["mean", pytest.param("sum", marks=SLOW)])
@pytest.mark.parametrize("convention", ["torch", pytest.param("jax", marks=SLOW)])
def test_reductions_equal_the_frameworks(convention, reduction, dtype):
    """PyTorch (one thread): forward and backward bit for bit; JAX: backward bit for bit, forward
    within XLA's summation order."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(700) * 2).round(1).astype(dtype)
    t = rng.choice([1.0, -1.0, 0.0], 700).astype(dtype)
    g = np.asarray(0.7, dtype)
    module = symgrad.load("hinge_embedding_loss", convention=convention, reduction=reduction, margin=0.5)
    got = _ours(module, x, t, g)
    if convention == "jax":
        (y, gx), (want_y, want_gx) = got, _jax(x, t, g, 0.5, reduction)
        assert_same_values(gx, want_gx, f"jax {reduction} backward")
        eps = 2.0 ** -7 if dtype in (np.float16, BF16) else float(np.finfo(dtype).eps) * 64
        assert abs(float(y) - float(want_y)) <= eps * abs(float(want_y)), (y, want_y)
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for a, b in zip(got, _torch(x, t, g, 0.5, reduction)):
            assert_same_values(a, b, f"torch {reduction}")
    finally:
        torch.set_num_threads(threads)


def _reference(x, t, margin, ties):
    """The definition, one element at a time: [t != 1] max(0, margin - x) + [t != -1] x, the max
    node's derivative by the README's policies (the 0 piece first)."""
    ys, gs = [], []
    for xi, ti in zip(x.tolist(), t.tolist()):
        v = margin - xi
        dv = 0.0 if v < 0 else -1.0 if v > 0 else {"first": 0.0, "last": -1.0, "split": -0.5, "all": -1.0}[ties]
        ys.append((max(0.0, v) if ti != 1 else 0.0) + (xi if ti != -1 else 0.0))
        gs.append((dv if ti != 1 else 0.0) + (1.0 if ti != -1 else 0.0))
    return np.array(ys), np.array(gs)


@pytest.mark.parametrize("ties", [pytest.param(t, marks=() if t == "split" else (SLOW,)) for t in POLICIES])
def test_every_policy_follows_the_definition(ties):
    x = np.array([v for v in VALUES if np.isfinite(v)] * len(TARGETS[:-1]))
    t = np.repeat(TARGETS[:-1], len(x) // len(TARGETS[:-1]))
    for margin in (1.0, 0.3, -0.5):
        y, gx = _ours(symgrad.load("hinge_embedding_loss", ties=ties, margin=margin), x, t, np.ones_like(x))
        want_y, want_g = _reference(x, t, margin, ties)
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(gx, want_g, err_msg=f"{ties} margin={margin}")


def test_finite_differences_away_from_the_kink():
    rng = np.random.default_rng(3)
    x, t, h = rng.standard_normal(40), rng.choice([1.0, -1.0, 0.0], 40), 1e-6
    f = lambda v: F.hinge_embedding_loss(torch.tensor(v), torch.tensor(t), reduction="none").numpy()  # noqa: E731
    for ties in POLICIES:
        gx = _ours(symgrad.load("hinge_embedding_loss", ties=ties), x, t, np.ones(40))[1]
        np.testing.assert_allclose(gx, (f(x + h) - f(x - h)) / (2 * h), atol=1e-6)


X = np.array([1.0, 1.0, 1.0, 0.5, 2.0, -0.5, 0.25])  # x = margin (1) under t = 1, -1, 0
T = np.array([1, -1, 0, -1, 0, 1, 3])


@pytest.mark.parametrize("ties", ["first", "last", "split"])
def test_check_passes_and_catches_a_planted_wrong_kink_value(ties):
    """symgrad.check (a composed module: no op definition, so 'all', which it reads as the sum of
    the whole output's one-sided derivatives, counts the smooth term x twice at t = 0: left out)."""
    module = symgrad.load("hinge_embedding_loss", ties=ties)
    report = symgrad.check(module, X, T, ties=ties, modes="both")
    assert report.ok, str(report)

    class Planted:  # the kink's gradient 1/4 where x = margin
        def forward(self, x, t):
            return module.forward(x, t)

        def backward(self, g, saved):
            gx, _ = module.backward(g, saved)
            return np.where((X == 1.0) & (T == -1), 0.25 * g, gx), None
    bad = symgrad.check(Planted(), X, T, ties=ties)
    assert not bad.ok and "[1] <- output[1]: expected" in str(bad), str(bad)


def test_jvp_transposes_backward_and_the_reduction():
    x, t = np.array([1.0, 2.0, -3.0, 0.5, 1.0]), np.array([1.0, -1.0, 0.0, -1.0, 0.0])
    tangent = np.array([1.0, 1.0, 2.0, 4.0, -3.0])
    for reduction in ("none", "mean"):
        module = symgrad.load("hinge_embedding_loss", convention="torch", reduction=reduction)
        y, saved = module.forward(x, t)
        g = np.arange(1.0, 6.0) if reduction == "none" else np.asarray(1.0)
        assert np.sum(module.jvp(tangent, None, saved) * g) == pytest.approx(
            float(module.backward(g, saved)[0] @ tangent))


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
@SLOW
def test_cpu_backend_equals_the_numpy_module():
    for convention in ("torch", "jax"):
        cpu = symgrad.load("hinge_embedding_loss", backend="cpu", convention=convention, margin=0.3)
        ref = symgrad.load("hinge_embedding_loss", convention=convention, margin=0.3)
        for dtype in (np.float64, np.float32, np.float16):
            x, t, g = _grid(dtype)
            for a, b in zip(_ours(cpu, x, t, g), _ours(ref, x, t, g)):
                assert_same_values(a, b, f"cpu {convention} {np.dtype(dtype).name}")


def test_errors_are_one_line(capsys):
    from symgrad.cli import main
    for op in ("hinge_embedding_loss", "multi_margin_loss"):  # composed: loaded only
        assert main(["generate", op, "--out", "unused"]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"symgrad: error: {op} is composed at the host level"), err
    with pytest.raises(TypeError, match=r"^hinge_embedding_loss: unexpected parameter 'p'"):
        symgrad.load("hinge_embedding_loss", p=1)
    with pytest.raises(ValueError, match=r"^unknown op 'multi_margin_los'; did you mean 'multi_margin_loss'\?"):
        symgrad.load("multi_margin_los")
    for op, backend in (("hinge_embedding_loss", "torch"), ("multi_margin_loss", "jax")):
        with pytest.raises(ValueError, match=rf"^{op}: composed with NumPy on the host \(symgrad/"
                                             rf"[a-z_]+\.py\), it runs on the backends numpy and "
                                             rf"cpu, got backend='{backend}'$"):
            symgrad.load(op, backend=backend)
    with pytest.raises(TypeError, match=r"^hinge_embedding_loss: margin must be a real number, got '1'$"):
        symgrad.load("hinge_embedding_loss", margin="1")
    with pytest.raises(ValueError, match=r"^hinge_embedding_loss: reduction must be one of"):
        symgrad.load("hinge_embedding_loss", reduction="avg")
    with pytest.raises(ValueError, match=r"^hinge_embedding_loss is composed at the host level"):
        symgrad.derive("hinge_embedding_loss")
    module = symgrad.load("hinge_embedding_loss")
    with pytest.raises(ValueError, match=r"^hinge_embedding_loss: target's shape \(2,\) does not "
                                         r"broadcast to input's \(3,\)$"):
        module.forward(np.ones(3), np.ones(2))
    with pytest.raises(TypeError, match=r"^hinge_embedding_loss: saved must be the Saved value"):
        module.backward(np.ones(3), None)


@SLOW  # (JAX compiles each row's function)
def test_conventions_table_rows_are_the_frameworks_gradients():
    """The hinge rows of docs/conventions.md (as committed): the torch and jax cells are PyTorch's
    autograd and jax.vjp of the functions the presets stand for, every cell is what the module
    gives, and DIFFER is flagged exactly where the two differ."""
    from pathlib import Path

    from symgrad import table
    import test_multi_margin30 as mm
    page = (Path(__file__).resolve().parent.parent / "docs" / "conventions.md").read_text().splitlines()
    rows = [s for s in table.SITUATIONS if s[0] in ("hinge_embedding_loss", "multi_margin_loss")]
    assert len(rows) == 4
    for op, params, situation, (x, t) in rows:
        row = next(ln for ln in page if ln.startswith(f"| `{op}` | {situation} |"))
        cells = row.split(" | ")[2:-1]
        assert cells == [table.measure(c, op, params, (x, t)) for c in table.COLUMNS], row
        x = np.array(x)
        g = np.ones(len(x))
        if op == "hinge_embedding_loss":
            want = _torch(x, np.array(t), g, 1.0)[1], _jax(x, np.array(t), g, 1.0)[1]
        else:
            want = (mm._torch(x, np.array(t), g, 1.0, None, "none")[1],
                    mm._jax(x, np.array(t), g, 1.0, None, "none")[1])
        assert cells[:2] == [table._cell([w]) for w in want], row
        assert row.endswith(" | DIFFER |") == (cells[0] != cells[1]), row


HINGE = "Max(0, 1 - x)"


@SLOW  # (the conventions command runs PyTorch's and JAX's autodiff of the expression: 10-25 s)
def test_the_plain_hinge_docs_commands_run_as_written(capsys, tmp_path, monkeypatch):
    """docs/conventions.md's plain hinge: `symgrad conventions --expr` prints the table the page
    shows, and `symgrad generate --expr` writes a module whose gradient at the kink x = 1 is the
    policy's (first: 0; the one-sided derivatives -1 and 0 around it)."""
    from pathlib import Path
    import importlib.util
    import shlex

    from symgrad.cli import main
    page = (Path(__file__).resolve().parent.parent / "docs" / "conventions.md").read_text()
    commands = [shlex.split(ln.split("  #")[0]) for ln in page.splitlines()
                if ln.startswith("symgrad ") and f'"{HINGE}"' in ln]
    assert [c[:3] for c in commands] == [["symgrad", "conventions", "--expr"],
                                         ["symgrad", "generate", "--expr"]]
    capsys.readouterr()
    assert main(commands[0][1:]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    assert printed and "\n".join(printed) in page
    monkeypatch.chdir(tmp_path)
    assert main(commands[1][1:]) == 0
    spec = importlib.util.spec_from_file_location("hinge", tmp_path / "hinge" / "hinge_first.py")
    hinge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hinge)
    x = np.array([1.0, 0.5, 2.0])
    y, saved = hinge.forward(x)
    np.testing.assert_array_equal(y, [0.0, 0.5, 0.0])
    np.testing.assert_array_equal(hinge.backward(np.ones(3), saved)[0], [0.0, -1.0, 0.0])
