"""symgrad.check(..., modes=...): forward mode against reverse mode at ties and kinks.

Oracles: PyTorch 2.13's own disagreement (torch.fmax at a tie: reverse mode (1, 0), forward mode
(0, 1), printed by torch.autograd.grad and torch.func.jvp themselves below), functions whose two
modes agree (torch.maximum, torch.relu, max_pool2d, jnp.fmax, jnp.maximum, symgrad's generated
modules, whose jvp is backward's transpose), and planted disagreements: a module whose jvp follows
one tie policy and whose backward another, and a jvp that is the (non-linear) directional
derivative.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from symgrad import catalog

from test_check import _inputs, _params
from conftest import first_entry_of_each_op  # noqa: E402

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

A = np.array([1.0, 2.0, 3.0, -1.0])
B = np.array([1.0, 0.0, 3.0, 0.5])  # ties at 0 and 2
TIED = np.array([[[1.0, 1.0, 0.0, 2.0], [1.0, 0.0, 2.0, 2.0], [3.0, 0.0, 0.0, 1.0], [0.0, 3.0, 1.0, 1.0]]])


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_torch_fmax_modes_disagree_at_a_tie():
    a, b = _t(A), _t(B)
    # the oracle: PyTorch's two modes, asked directly, at the tie A[0] == B[0]
    ra, rb = torch.autograd.grad(torch.fmax(a.requires_grad_(), b.requires_grad_()), (a, b), _t(np.eye(4)[0]))
    fa = torch.func.jvp(torch.fmax, (a.detach(), b.detach()), (_t(np.eye(4)[0]), _t(np.zeros(4))))[1][0]
    fb = torch.func.jvp(torch.fmax, (a.detach(), b.detach()), (_t(np.zeros(4)), _t(np.eye(4)[0])))[1][0]
    assert (float(ra[0]), float(rb[0])) == (1.0, 0.0) and (float(fa), float(fb)) == (0.0, 1.0)

    a, b = _t(A), _t(B)
    assert symgrad.check(torch.fmax, a, b, ties="first").ok  # reverse mode alone: first, consistent
    assert symgrad.check(torch.fmax, a, b, ties="last", modes="forward").ok  # forward mode alone: last
    assert not symgrad.check(torch.fmax, a, b, ties="first", modes="forward").ok
    report = symgrad.check(torch.fmax, a, b, ties="first", modes="both")
    assert not report.ok
    assert {f.kind for f in report.failures} == {"modes"}
    found = {(f.input, f.index, f.output): (f.expected, f.got) for f in report.failures}
    # exactly the tied entries, each with reverse mode's value (expected) and forward mode's (got)
    assert found == {("input0", (0,), (0,)): (1.0, 0.0), ("input1", (0,), (0,)): (0.0, 1.0),
                     ("input0", (2,), (2,)): (1.0, 0.0), ("input1", (2,), (2,)): (0.0, 1.0)}
    text = str(report)
    assert "forward and reverse mode" in text and "at a tie of 2 elements" in text
    assert "forward mode <jvp(+e), e_o> = 0.0, reverse mode <+e, vjp(e_o)> = 1.0" in text


def test_torch_functions_whose_modes_agree():
    F = torch.nn.functional
    a, b = _t(A), _t(B)
    for fn, ties in ((torch.maximum, "split"), (torch.minimum, "split"), (torch.fmin, "first")):
        report = symgrad.check(fn, a, b, ties=ties, modes="both")
        assert report.ok, str(report)
        assert report.tied_windows == 2 and report.compared > 0
    x = _t([-1.0, 0.0, 0.0, 2.0])
    report = symgrad.check(torch.relu, x, ties="first", op="relu", modes="both")
    assert report.ok and report.kinks == 2 and report.compared == 3, str(report)
    assert symgrad.check(lambda t: F.max_pool2d(t, 2), _t(TIED), ties="first", modes="both").ok
    assert symgrad.check(lambda t: torch.clamp(t, -1.0, 1.0), _t([-1.0, 0.0, 1.0, 2.0]), ties="first",
                         op="clamp", params={"min": -1.0, "max": 1.0}, modes="both").ok


@pytest.mark.parametrize("ties", ["first", "last", "split", "all"])
def test_symgrad_modules_and_torch_ops_pass(ties):
    import symgrad.torch as st

    m = symgrad.load("maximum", ties=ties)
    for fn, args in ((m, (A, B)), (st.op("maximum", ties=ties), (_t(A), _t(B)))):
        report = symgrad.check(fn, *args, modes="both")
        assert report.ok, str(report)
        assert report.tied_windows == 2 and report.compared == 6  # 4 outputs: 2 tied, 2 with one element
    pool = symgrad.load("max_pool2d", kernel_size=2, ties=ties)
    assert symgrad.check(pool, TIED, modes="both").ok
    assert symgrad.check(symgrad.load("relu", ties=ties), np.array([-1.0, 0.0, 2.0]), modes="both").ok


class _Mixed:
    """A module whose forward and backward follow one tie policy and whose jvp another."""

    def __init__(self, reverse, forward):
        self.reverse, self.forward_mode = reverse, forward
        self.INPUTS, self.OP, self.TIES = reverse.INPUTS, reverse.OP, reverse.TIES

    def forward(self, *xs):
        return self.reverse.forward(*xs)[0], xs

    def backward(self, g, xs):
        return self.reverse.backward(g, self.reverse.forward(*xs)[1])

    def jvp(self, *ts_and_saved):
        *ts, xs = ts_and_saved
        return self.forward_mode.jvp(*ts, self.forward_mode.forward(*xs)[1])


def test_catches_a_planted_disagreement():
    mixed = _Mixed(symgrad.load("maximum", ties="first"), symgrad.load("maximum", ties="split"))
    assert symgrad.check(mixed, A, B).ok  # reverse mode, the default: first, as claimed
    assert symgrad.check(mixed, A, B, modes="reverse").ok
    report = symgrad.check(mixed, A, B, modes="both")
    assert not report.ok and {f.kind for f in report.failures} == {"modes"}
    assert {(f.input, f.index, f.expected, f.got) for f in report.failures} == {
        ("a", (0,), 1.0, 0.5), ("b", (0,), 0.0, 0.5), ("a", (2,), 1.0, 0.5), ("b", (2,), 0.0, 0.5)}
    forward = symgrad.check(mixed, A, B, modes="forward")  # the jvp against the claimed policy
    assert not forward.ok and "tie" in {f.kind for f in forward.failures}
    # a window op: the jvp gives a pooling tie to the last element, backward to the first
    pool = _Mixed(symgrad.load("max_pool2d", kernel_size=2, ties="first"),
                  symgrad.load("max_pool2d", kernel_size=2, ties="last"))
    report = symgrad.check(pool, TIED, modes="both")
    assert not report.ok and {f.kind for f in report.failures} == {"modes"}
    assert all(f.detail.endswith("at a tie of 2 elements") or f.detail.endswith("at a tie of 3 elements")
               for f in report.failures)


def test_catches_a_jvp_that_is_not_linear():
    """The directional derivative max(t_a, t_b) at a tie agrees with 'all' on +e and not on -e."""
    m = symgrad.load("maximum", ties="all")

    def forward(a, b):
        return m.forward(a, b)[0]

    def vjp(g, a, b):
        return m.backward(g, m.forward(a, b)[1])

    def jvp(ts, a, b):
        ta, tb = ts
        return np.where(a > b, ta, np.where(a < b, tb, np.maximum(ta, tb)))
    assert symgrad.check((forward, vjp, lambda ts, a, b: m.jvp(*ts, m.forward(a, b)[1])), A, B,
                         ties="all", modes="both").ok
    report = symgrad.check((forward, vjp, jvp), A, B, ties="all", modes="both")
    assert not report.ok and {f.kind for f in report.failures} == {"modes"}
    assert all("jvp(-e)" in f.detail and f.expected == -1.0 and f.got == 0.0 for f in report.failures)
    assert len(report.failures) == 4


def test_jax_functions():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import symgrad.jax as sj
    a, b = jnp.array(A), jnp.array(B)
    # JAX's fmax gives a tie to its second argument in both modes; maximum splits in both
    assert symgrad.check(jnp.fmax, a, b, ties="last", modes="both").ok
    assert symgrad.check(jnp.maximum, a, b, ties="split", modes="both").ok
    assert symgrad.check(jnp.maximum, a, b, ties="split", modes="forward").ok
    assert symgrad.check(sj.op("maximum", ties="first"), a, b, modes="both").ok

    @jax.custom_jvp
    def planted(x, y):  # reverse mode by transposing a jvp that splits; the primal is plain max
        return jnp.maximum(x, y)

    @planted.defjvp
    def _(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        return jnp.maximum(x, y), jnp.where(x > y, tx, jnp.where(x < y, ty, (tx + ty) / 2))
    assert symgrad.check(planted, a, b, ties="split", modes="both").ok  # transposed: they agree
    assert not symgrad.check(planted, a, b, ties="first", modes="forward").ok


def test_errors_and_the_default():
    m = symgrad.load("maximum", ties="first")
    with pytest.raises(ValueError, match=r"modes must be one of reverse, forward, both, got 'sideways'"):
        symgrad.check(m, A, B, modes="sideways")
    with pytest.raises(ValueError, match="modes must be one of"):
        symgrad.check(m, A, B, modes=None)

    def forward(a, b):
        return m.forward(a, b)[0]

    def vjp(g, a, b):
        return m.backward(g, m.forward(a, b)[1])
    assert symgrad.check((forward, vjp), A, B, ties="first").ok
    with pytest.raises(TypeError, match=r"modes='both' needs fn's forward mode.*\(forward, vjp, jvp\)"):
        symgrad.check((forward, vjp), A, B, ties="first", modes="both")

    class NoForwardMode(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x.clamp(min=0)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (x > 0)
    x = _t([-1.0, 0.0, 2.0])
    assert symgrad.check(NoForwardMode.apply, x, ties="first", op="relu").ok
    with pytest.raises(TypeError, match="needs fn's forward mode, and torch.func.jvp of fn failed"):
        symgrad.check(NoForwardMode.apply, x, ties="first", op="relu", modes="forward")
    # the default report reads as before; modes shows in the head otherwise
    assert str(symgrad.check(m, A, B)).startswith("symgrad.check (first): ok; 4 outputs")
    assert str(symgrad.check(m, A, B, modes="forward")).startswith("symgrad.check (first, forward mode): ok")
    assert "6 entries compared between forward and reverse mode" in str(symgrad.check(m, A, B, modes="both"))


def _catalog_entries():
    """Every catalog entry: the first of each op in the default run, the others with -m slow."""
    return first_entry_of_each_op(catalog.entries())


@pytest.mark.parametrize("entry", list(_catalog_entries()), ids=lambda e: f"{e.name}-{e.ties}-{e.params}")
def test_the_catalog_passes_both_modes(entry):
    """Every catalog entry under its policy: the generated jvp is backward's transpose, so the
    two modes agree at every tie and kink the checker finds (unpooling's writers included)."""
    module = symgrad.load(entry.name, ties=entry.ties, **_params(entry))
    report = symgrad.check(module, *_inputs(entry, np.random.default_rng(0)), rtol=1e-5, atol=1e-7, modes="both")
    assert report.ok, str(report)
    assert report.compared > 0


def test_symgrad_jax_op_with_a_constant_input():
    """fractional pooling's samples have no gradient: the checker's jax.vjp left them in the
    differentiated arguments, and symgrad.jax refused ("random_samples is not differentiated")."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import symgrad.jax as sj
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(-2, 3, size=(1, 1, 4, 4)).astype(np.float64))  # ties in most windows
    samples = jnp.asarray(rng.random((1, 1, 2)))
    op = sj.op("fractional_max_pool2d", kernel_size=3, output_ratio=0.5, ties="first")
    report = symgrad.check(op, x, samples, modes="both")  # the reverse checks, and forward mode against them
    assert report.ok and report.tied_windows > 0 and report.compared > 0, str(report)
