"""symgrad.check: it passes every catalog op under every policy, and catches seeded bugs.

The seeded bugs are real modules whose backward is altered the way real bugs are: the tie given
to the wrong element, 'all' where 'split' is claimed, a lost 1/k share, a wrong value away from
ties, a kink's gradient taken on the wrong side.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import symgrad
from symgrad import catalog
from symgrad.policy import POLICIES

from cuda_harness.check import _extra_shapes
from conftest import first_entry_of_each_op  # noqa: E402

if os.environ.get("CI"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")


def _ints(rng, shape, lo=-2, hi=3):
    return rng.integers(lo, hi, size=shape).astype(np.float64)


def _inputs(entry, rng):
    kind = entry.spec.kind
    if kind == "unpool":
        d = entry.spec.spatial
        x = _ints(rng, (1, 2) + (2,) * d)
        size = int(np.prod(symgrad.load(entry.name, **_params(entry)).forward(x, np.zeros(x.shape, np.int64))[0].shape[-d:]))
        return [x, rng.integers(0, max(1, size // 2), size=x.shape)]  # repeated indices: writers tie
    if kind == "logsumexp":
        return [rng.standard_normal((2, 3, 4))]
    if kind == "segment":  # scatter: (input, index, src); segment: (data, segment_ids)
        if len(entry.spec.inputs) == 3:
            return [_ints(rng, (4,)), rng.integers(0, 4, 7), _ints(rng, (7,))]
        if "indptr" in entry.spec.inputs:  # CSR offsets, an empty segment among them
            return [_ints(rng, (7, 2)), np.array([0, 3, 3, 7])]
        return [_ints(rng, (7, 2)), rng.integers(0, 3, 7)]
    if kind == "bag":  # (input, weight, offsets): an empty bag, table rows in several bags; each
        # bag lists distinct rows in ascending order (check orders tied rows by the table's index)
        return [np.array([0, 2, 5, 1, 3, 4, 0, 1, 5]), _ints(rng, (6, 3)), np.array([0, 3, 3, 6])]
    if kind == "roi":  # (input, boxes): overlapping boxes and bins
        return [_ints(rng, (1, 2, 5, 5)), np.array([[0.0, 0, 0, 4, 4], [0.0, 1, 1, 3, 4]])]
    shapes = _extra_shapes(entry)
    if kind in ("pool", "adaptive"):  # small planes: every window is probed
        shapes = [s[:2] + tuple(min(n, 5) for n in s[2:]) for s in shapes]
    # fractional pooling's samples (no gradient, not probed) lie in [0, 1)
    return [rng.random(s) if name in entry.spec.constant_inputs else _ints(rng, s)
            for name, s in zip(entry.spec.inputs, shapes)]


def _params(entry):
    return {p.name: entry.params[p.name] for p in entry.spec.params}


@pytest.mark.parametrize("entry", list(first_entry_of_each_op(catalog.entries())),
                         ids=lambda e: f"{e.name}-{e.ties}-{e.params}")
@pytest.mark.parametrize("ties", POLICIES)
def test_passes_the_catalog_under_every_policy(entry, ties):
    try:
        module = symgrad.load(entry.name, ties=ties, **_params(entry))
    except ValueError:
        pytest.skip(f"{entry.name} has no policy {ties!r}")
    rng = np.random.default_rng(0)
    report = symgrad.check(module, *_inputs(entry, rng), rtol=1e-5, atol=1e-7)
    assert report.ok, str(report)
    assert report.outputs > 0
    if ties == "all" and (report.tied_windows and entry.spec.kind != "elementwise"):
        assert report.not_subgradient > 0


def _altered(module, change):
    """(forward, vjp) of a module whose backward is changed by change(grads, xs, g)."""
    def forward(*xs):
        return module.forward(*xs)[0]

    def vjp(g, *xs):
        _, saved = module.forward(*xs)
        return change([np.array(gr) if gr is not None else None for gr in module.backward(g, saved)], xs, g)
    return forward, vjp


TIED = np.array([[[1.0, 1.0, 0.0, 2.0], [1.0, 0.0, 2.0, 2.0], [3.0, 0.0, 0.0, 1.0], [0.0, 3.0, 1.0, 1.0]]])


def test_catches_a_tie_given_to_the_wrong_element():
    last = symgrad.load("max_pool2d", kernel_size=2, ties="last")
    report = symgrad.check(_altered(last, lambda grads, xs, g: grads), TIED, ties="first")
    assert not report.ok and {f.kind for f in report.failures} == {"tie"}
    assert symgrad.check(last, TIED).ok  # the same backward, under the policy it implements


def test_catches_all_where_split_is_claimed():
    all_ = symgrad.load("maximum", ties="all")
    a, b = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 3.0])
    report = symgrad.check(_altered(all_, lambda grads, xs, g: grads), a, b, ties="split")
    assert not report.ok and "tie" in {f.kind for f in report.failures}
    report = symgrad.check(all_, a, b)
    assert report.ok and report.not_subgradient == 2


def test_catches_a_lost_share():
    split = symgrad.load("amax", dim=-1, ties="split")
    x = np.array([[2.0, 2.0, 2.0, 0.0], [1.0, 3.0, 0.0, 0.0]])

    def lose(grads, xs, g):
        grads[0][0, 2] = 0.0  # one of three tied elements loses its 1/3
        return grads
    report = symgrad.check(_altered(split, lose), x, ties="split")
    kinds = {f.kind for f in report.failures}
    assert not report.ok and "tie" in kinds and "mass" in kinds


def test_catches_a_wrong_value_away_from_ties():
    relu = symgrad.load("leaky_relu", negative_slope=0.25)
    x = np.array([-2.0, -1.0, 0.5, 3.0])

    def wrong(grads, xs, g):
        grads[0] = np.where(xs[0] < 0, grads[0] * 2, grads[0])  # slope 0.5 where 0.25 is
        return grads
    report = symgrad.check(_altered(relu, wrong), x, ties="first", op="leaky_relu", params={"negative_slope": 0.25})
    assert not report.ok and {f.kind for f in report.failures} == {"smooth"}
    assert len(report.failures) == 2


def test_catches_a_kink_gradient_on_the_wrong_side():
    x = np.array([-1.0, 0.0, 0.0, 2.0])
    relu_last = symgrad.load("relu", ties="last")  # relu = max(0, x): last is x's side, 1 at 0
    report = symgrad.check(_altered(relu_last, lambda grads, xs, g: grads), x, ties="first", op="relu")
    assert not report.ok and {f.kind for f in report.failures} == {"kink"}
    assert all(f.expected == 0.0 and f.got == 1.0 for f in report.failures)
    clamp = symgrad.load("clamp", min=-1.0, max=1.0, ties="first")
    flipped = _altered(clamp, lambda grads, xs, g: [np.where(np.abs(xs[0]) == 1.0, g - grads[0], grads[0])])
    report = symgrad.check(flipped, np.array([-1.0, 0.0, 1.0]), ties="first", op="clamp",
                           params={"min": -1.0, "max": 1.0})
    assert not report.ok and len(report.failures) == 2


def test_nan_and_inf_are_skipped_not_failed():
    m = symgrad.load("max_pool1d", kernel_size=2, ties="split")
    report = symgrad.check(m, np.array([[1.0, np.nan, 2.0, 2.0, np.inf, 0.0]]))
    assert report.ok and report.skipped == 2 and report.outputs == 1


def test_torch_functions_and_symgrad_torch_ops():
    import symgrad.torch as st

    F = torch.nn.functional
    x = torch.tensor(TIED)
    assert symgrad.check(st.op("max_pool2d", kernel_size=2, ties="split"), x).ok
    assert symgrad.check(lambda t: F.max_pool2d(t, 2), x, ties="first").ok  # PyTorch: first
    assert not symgrad.check(lambda t: F.max_pool2d(t, 2), x, ties="last").ok
    assert symgrad.check(lambda t: torch.amax(t, -1), x, ties="split").ok  # torch.amax splits
    assert symgrad.check(F.relu, torch.tensor([-1.0, 0.0, 2.0]), ties="first", op="relu").ok  # 0 at 0


def test_jax_functions():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import symgrad.jax as sj
    a, b = jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 0.0, 3.0])
    assert symgrad.check(sj.op("maximum", ties="split"), a, b).ok
    assert symgrad.check(jnp.maximum, a, b, ties="split").ok  # JAX splits maximum's ties
    assert not symgrad.check(jnp.maximum, a, b, ties="first").ok


def test_report_and_errors():
    m = symgrad.load("maximum", ties="last")
    report = symgrad.check(_altered(m, lambda grads, xs, g: grads), np.array([1.0]), np.array([1.0]), ties="first")
    text = str(report)
    assert "1 tied windows" in text and "2 elements tied" in text and "input 0 at [0]" in text
    with pytest.raises(ValueError, match="ties must be one of first, last, split, all"):
        symgrad.check(m, np.ones(2), np.ones(2), ties="middle")
    with pytest.raises(TypeError, match="fn must be a generated module"):
        symgrad.check(lambda x: x, np.ones(2), ties="first")
    with pytest.raises(ValueError, match="give the inputs"):
        symgrad.check(m)


def test_a_failure_names_its_kind_once():
    """A failure's line says its kind once: the report said "(smooth: smooth: central
    differences)", "(kink: kink: ...)" and "(tie: tie of 2: ...)"."""
    leaky = symgrad.load("leaky_relu", negative_slope=0.25)
    doubled = _altered(leaky, lambda grads, xs, g: [grads[0] * 2])
    reports = [symgrad.check(doubled, np.array([-2.0, 0.0, 0.5]), ties="first", op="leaky_relu",
                             params={"negative_slope": 0.25}),
               symgrad.check(doubled, np.array([-2.0, 0.0, 0.5]), ties="split"),
               symgrad.check(_altered(symgrad.load("max_pool2d", kernel_size=2, ties="last"),
                                      lambda grads, xs, g: grads), TIED, ties="first")]
    kinds = {f.kind for r in reports for f in r.failures}
    assert kinds >= {"smooth", "kink", "tie"}, kinds
    for report in reports:
        for line in str(report).splitlines()[1:]:
            kind, detail = re.search(r"\((\w+): (.*)\)$", line).groups()
            assert not re.match(rf"{kind}\b", detail), line
