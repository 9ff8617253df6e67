"""embedding_bag_max (issue 33, item 3): the torch preset against F.embedding_bag(mode="max") on
the CPU bit for bit (output and the table's gradient; tie-heavy, NaN, +-inf, +-0, empty bags,
padding_idx, include_last_offset, 2-d input), every policy and NaN rule against a brute-force loop
written here from the README's definition (bag b's output is the max of its table rows, W's row b
the policy's weights over the bag, the gradient of a gathered row added onto its table row in
index order), jvp against the same loop, symgrad.check, bad input, the backends that refuse."""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import pytest

import symgrad
from conftest import assert_same_values

VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]
OP = "embedding_bag_max"


def _case(rng, dtype, vocab=6, features=3, length=12, bags=5, nan=True):
    """A tie-heavy table, table rows (repeats) and non-decreasing offsets from 0 (empty bags)."""
    pool = VALUES if nan else VALUES[:-1]
    weight = np.array(rng.choice(pool, size=(vocab, features)), dtype=dtype)
    rows = rng.integers(0, vocab, size=length)
    offsets = np.sort(np.concatenate([[0], rng.integers(0, length + 1, size=bags - 1)]))
    return rows, weight, offsets


def _bags(rows, offsets, include_last, padding, vocab):
    """Each bag's elements (positions into rows), from PyTorch's documented bags."""
    ends = list(offsets[1:]) if include_last else list(offsets[1:]) + [rows.size]
    starts = offsets[:-1] if include_last else offsets
    pad = None if padding is None else padding % vocab
    return [[i for i in range(s, e) if rows[i] != pad] for s, e in zip(starts, ends)]


def _row_weights(values, ties, nan):
    """W's row over one bag's values (one column), and the bag's output, by the definition."""
    k = len(values)
    isnan = [np.isnan(v) for v in values]
    if nan == "keep":  # a later element takes over on a strict >: NaN never does, a NaN first stays
        win = 0
        for i in range(1, k):
            if values[i] > values[win] or (ties == "last" and values[i] == values[win]):
                win = i
        w = [0.0] * k
        w[win] = 1.0
        return w, values[win]
    if any(isnan):  # a NaN beats every number, NaNs tie (dominate); IEEE equality (zero/nan/each)
        out = np.nan
        hits = isnan if nan == "dominate" else [False] * k
    else:
        out = max(values)
        hits = [v == out for v in values]
    if ties in ("first", "last"):
        at = [i for i in range(k) if hits[i]]
        win = at[0] if ties == "first" else at[-1]
        w = [1.0 if i == win else 0.0 for i in range(k)]
        out = values[win]  # its sign of zero
    elif nan == "each" and any(isnan):
        w = [1.0] * k
    else:
        count = sum(hits)
        w = [Fraction(1, count if ties == "split" else 1) if hits[i] else 0.0 for i in range(k)]
        if nan == "nan" and count == 0:
            w = [np.nan] * k
        if count and not np.isnan(out):
            out = values[hits.index(True)]
    return w, out


def _times(w, g):
    """A W entry times g: the split's 1/k as g / k (its weight), NaN as NaN."""
    return g / w.denominator if isinstance(w, Fraction) else w * g


def _oracle(rows, weight, offsets, g, t, ties, nan, include_last=False, padding=None):
    """(output, grad_weight, jvp) by loops: each bag and column, its W-row; the gradient of each
    gathered row added onto its table row in index order."""
    bags = _bags(rows, offsets, include_last, padding, weight.shape[0])
    out = np.zeros((len(bags), weight.shape[1]), dtype=weight.dtype)
    grad = np.zeros_like(weight)
    tangent = np.zeros_like(out)
    for f in range(weight.shape[1]):
        terms = []
        for b, members in enumerate(bags):
            if not members:
                continue
            w, out[b, f] = _row_weights([weight[rows[i], f] for i in members], ties, nan)
            terms += [(i, b, wi) for i, wi in zip(members, w)]
            tangent[b, f] = sum(_times(wi, t[rows[i], f]) for i, wi in zip(members, w) if wi != 0)
        for i, b, wi in sorted(terms):  # index order
            if wi != 0:
                grad[rows[i], f] += _times(wi, g[b, f])
    return out, grad, tangent


# ----------------------------------------------------------------------------- every policy

_slow = pytest.mark.slow
SETTINGS = [("first", "dominate"), pytest.param("last", "dominate", marks=_slow), ("split", "dominate"),
            pytest.param("all", "dominate", marks=_slow), ("first", "keep"), ("last", "keep"),
            ("split", "zero"), pytest.param("split", "nan", marks=_slow),
            pytest.param("split", "each", marks=_slow), pytest.param("all", "zero", marks=_slow)]


@pytest.mark.parametrize("ties,nan", SETTINGS)
def test_every_policy_against_the_definition(ties, nan):
    mod = symgrad.load(OP, ties=ties, nan=nan)
    rng = np.random.default_rng(5)
    for seed in range(3):
        rows, weight, offsets = _case(rng, np.float64)
        g = rng.normal(size=(offsets.size, weight.shape[1]))
        t = rng.normal(size=weight.shape)
        out, saved = mod.forward(rows, weight, offsets)
        want_out, want_grad, want_t = _oracle(rows, weight, offsets, g, t, ties, nan)
        assert_same_values(out, want_out, f"{ties}/{nan} output, seed {seed}")
        assert_same_values(mod.backward(g, saved)[1], want_grad, f"{ties}/{nan} grad_weight",
                           zeros=False)
        np.testing.assert_allclose(mod.jvp(None, t, None, saved), want_t, rtol=1e-12)


# ----------------------------------------------------------------------------- PyTorch

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _torch(rows, weight, offsets, g, **kw):
    w = torch.tensor(weight, requires_grad=True)
    out = F.embedding_bag(torch.tensor(rows), w, None if offsets is None else torch.tensor(offsets),
                          mode="max", **kw)
    out.backward(torch.tensor(g))
    return out.detach().numpy(), w.grad.numpy()


def _same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    nan = np.isnan(want)
    bits = f"u{want.dtype.itemsize}"
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(
        got.view(bits)[~nan], want.view(bits)[~nan]), f"{what}: got {got.tolist()}, want {want.tolist()}"


@pytest.mark.parametrize("dtype,include_last_offset,padding_idx", [
    (np.float32, False, None), (np.float64, True, 2), (np.float32, False, -1),
    pytest.param(np.float64, False, None, marks=_slow), pytest.param(np.float32, True, 2, marks=_slow),
    pytest.param(np.float64, False, -1, marks=_slow)])
def test_torch_preset_bit_for_bit(dtype, include_last_offset, padding_idx):
    mod = symgrad.load(OP, convention="torch", include_last_offset=include_last_offset,
                       padding_idx=padding_idx)
    rng = np.random.default_rng(11)
    for seed in range(10):
        rows, weight, offsets = _case(rng, dtype, length=int(rng.integers(0, 14)))
        offsets = np.minimum(offsets, rows.size)
        if include_last_offset:
            offsets[-1] = rows.size
        bags = offsets.size - include_last_offset
        g = np.array(rng.choice(VALUES + [0.5, 3.0, -2.5], size=(bags, weight.shape[1])), dtype=dtype)
        want_out, want_grad = _torch(rows, weight, offsets, g, include_last_offset=include_last_offset,
                                     padding_idx=padding_idx)
        out, saved = mod.forward(rows, weight, offsets)
        _same_bits(out, want_out, f"output, case {seed}")
        _same_bits(mod.backward(g, saved)[1], want_grad, f"grad_weight, case {seed}")


def test_torch_preset_2d_input():
    mod = symgrad.load(OP, convention="torch")
    rng = np.random.default_rng(3)
    weight = np.array(rng.choice(VALUES, size=(5, 4)), dtype=np.float32)
    rows = rng.integers(0, 5, size=(6, 3))
    g = np.array(rng.normal(size=(6, 4)), dtype=np.float32)
    want_out, want_grad = _torch(rows, weight, None, g)
    out, saved = mod.forward(rows, weight, None)
    _same_bits(out, want_out, "output")
    _same_bits(mod.backward(g, saved)[1], want_grad, "grad_weight")


def test_torch_rule_at_nan_and_zeros():
    """PyTorch's CPU rule, read from at::_embedding_bag: a NaN later in a bag is ignored, a NaN
    that comes first keeps the bag; of +0 and -0 the first wins."""
    mod = symgrad.load(OP, convention="torch")
    weight = np.array([[1.0], [np.nan], [3.0], [0.0], [-0.0]], dtype=np.float32)
    for rows, want in (([0, 1, 2], 3.0), ([1, 0, 2], np.nan), ([4, 3], -0.0), ([3, 4], 0.0)):
        out, _ = mod.forward(np.array(rows), weight, np.array([0]))
        assert_same_values(out, np.array([[want]], dtype=np.float32), str(rows))
        _same_bits(out, _torch(np.array(rows), weight, np.array([0]), np.ones((1, 1), np.float32))[0],
                   str(rows))


def test_include_last_offset_short_of_the_end_is_refused():
    """PyTorch reads offsets[-1] < len(input) two ways under include_last_offset: mode 'sum' on
    float32 ends the last bag there, mode 'max' (the CPU kernel's offset2bag) runs it to the
    input's end; symgrad refuses it."""
    weight = np.arange(12.0, dtype=np.float32).reshape(6, 2)
    rows, offsets = np.array([0, 3, 5, 1]), np.array([0, 2])
    run = lambda mode: F.embedding_bag(torch.tensor(rows), torch.tensor(weight), torch.tensor(offsets),  # noqa: E731
                                       mode=mode, include_last_offset=True).numpy()
    assert run("sum").tolist() == [list(weight[0] + weight[3])]
    assert run("max").tolist() == [list(weight[[0, 3, 5, 1]].max(axis=0))]
    mod = symgrad.load(OP, convention="torch", include_last_offset=True)
    with pytest.raises(ValueError, match=r"offsets\[-1\] must be input's length 4"):
        mod.forward(rows, weight, offsets)


# ----------------------------------------------------------------------------- check, errors, backends

@pytest.mark.parametrize("ties", ["first", "split"])
def test_symgrad_check_decides_bags(ties):
    mod = symgrad.load(OP, ties=ties)
    weight = np.array([[1.0, 2.0], [1.0, 0.0], [3.0, 2.0]])
    args = (np.array([0, 1, 2, 1, 2]), weight, np.array([0, 2]))
    report = symgrad.check(mod, *args)
    # (bag 1 holds table row 2 twice: a tie check cannot move one copy apart from the other)
    assert report and report.tied_windows == 1, str(report)
    assert not symgrad.check(mod, *args, ties="last")


def test_bad_input_is_one_line():
    mod = symgrad.load(OP)
    weight = np.zeros((3, 2))
    for rows, offsets, match in (([0, 1], [1], "offsets must be non-decreasing from 0"),
                                 ([0, 1], [0, 3], "offsets must be non-decreasing"),
                                 ([0, 3], [0], r"table rows in \[0, 3\)"),
                                 ([[0, 1]], [0], "2-d input with offsets None"),
                                 ([0, 1], None, "1-d input with offsets")):
        with pytest.raises(ValueError, match=match):
            mod.forward(np.array(rows), weight, None if offsets is None else np.array(offsets))
    with pytest.raises(TypeError, match="integers"):
        mod.forward(np.array([0.0]), weight, np.array([0]))
    with pytest.raises(ValueError, match="padding_idx must be within"):
        symgrad.load(OP, padding_idx=5).forward(np.array([0]), weight, np.array([0]))
    with pytest.raises(ValueError, match="nan must be 'dominate' or 'keep'"):
        symgrad.load(OP, ties="first", nan="replace")


@pytest.mark.parametrize("backend", ["cuda"])
def test_other_backends_refuse_in_one_line(backend):
    with pytest.raises(ValueError) as info:
        symgrad.load(OP, backend=backend)
    assert "\n" not in str(info.value) and "bags" in str(info.value)


# ----------------------------------------------------------------------------- JAX

def _jax(rows, weight, offsets, g):
    """What one writes in JAX: segment_max of the gathered rows by bag, an empty bag's -inf to 0
    (jitted once per shape and dtype)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    ends = np.append(offsets[1:], rows.size)
    ids = np.repeat(np.arange(offsets.size), ends - offsets)
    out, vjp = jax.vjp(lambda w: _jax_bag(w, rows, ids, ends == offsets), jax.numpy.asarray(weight))
    return np.asarray(out), np.asarray(vjp(jax.numpy.asarray(g))[0])


@functools.cache
def _jax_bag_jitted():
    import jax

    def bag(w, rows, ids, empty):
        out = jax.ops.segment_max(w[rows], ids, num_segments=empty.shape[0])
        return jax.numpy.where(empty[:, None], 0.0, out).astype(w.dtype)
    return jax.jit(bag)


def _jax_bag(w, rows, ids, empty):
    return _jax_bag_jitted()(w, rows, ids, empty)


@pytest.mark.slow  # (JAX's first jit: about 3 s)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_jax_preset_bit_for_bit(dtype):
    mod = symgrad.load(OP, convention="jax")
    rng = np.random.default_rng(13)
    for seed in range(3):
        rows, weight, offsets = _case(rng, dtype)
        g = np.array(rng.normal(size=(offsets.size, weight.shape[1])), dtype=dtype)
        want_out, want_grad = _jax(rows, weight, offsets, g)
        out, saved = mod.forward(rows, weight, offsets)
        _same_bits(out, want_out, f"output, case {seed}")
        _same_bits(mod.backward(g, saved)[1], want_grad, f"grad_weight, case {seed}")


# ----------------------------------------------------------------------------- symgrad.torch.EmbeddingBag

def test_symgrad_torch_embedding_bag_is_pytorchs_under_the_torch_preset():
    import symgrad.torch as st
    rng = np.random.default_rng(17)
    rows, weight, offsets = _case(rng, np.float32)
    for padding_idx in (None, 3):
        mine = st.EmbeddingBag(*weight.shape, padding_idx=padding_idx, _weight=torch.tensor(weight),
                               convention="torch")
        ref = torch.nn.EmbeddingBag(*weight.shape, mode="max", padding_idx=padding_idx,
                                    _weight=torch.tensor(weight))
        for args in ((torch.tensor(rows), torch.tensor(offsets)), (torch.tensor(rows[:12].reshape(4, 3)),)):
            y, want = mine(*args), ref(*args)
            g = torch.tensor(rng.normal(size=tuple(want.shape)), dtype=torch.float32)
            y.backward(g)
            want.backward(g)
            _same_bits(y.detach().numpy(), want.detach().numpy(), f"output {padding_idx}")
            _same_bits(mine.weight.grad.numpy(), ref.weight.grad.numpy(), f"grad {padding_idx}")
            mine.weight.grad = ref.weight.grad = None


def test_symgrad_torch_embedding_bag_under_a_policy_and_its_refusals():
    import symgrad.torch as st
    rng = np.random.default_rng(19)
    rows, weight, offsets = _case(rng, np.float64)
    bag = st.EmbeddingBag(*weight.shape, _weight=torch.tensor(weight), ties="split")
    y = bag(torch.tensor(rows), torch.tensor(offsets))
    g = rng.normal(size=tuple(y.shape))
    y.backward(torch.tensor(g))
    _, want_grad, _ = _oracle(rows, weight, offsets, g, np.zeros_like(weight), "split", "dominate")
    assert_same_values(bag.weight.grad.numpy(), want_grad, "split grad_weight", zeros=False)
    for kw in ({"mode": "sum"}, {"sparse": True}, {"max_norm": 1.0}):
        with pytest.raises(ValueError, match="not supported by symgrad.torch"):
            st.EmbeddingBag(3, 2, **kw)
