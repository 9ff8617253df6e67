"""The torch and jax backends' segment modules (scatter_max/min, segment_max/min; issue 33)
against the NumPy module (itself checked against the definition and the frameworks in
test_segment.py), bit for bit on the CPU: output, backward and jvp on tie-heavy inputs with NaN,
+-inf and +-0, every policy, NaN rule and preset, float16/32/64 and bfloat16; and the framework
ops symgrad.torch.op / symgrad.jax.op on these native modules against torch.scatter_reduce and
jax.ops.segment_max."""

from __future__ import annotations

import re

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")

VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]
POLICIES = [{"ties": t} for t in ("first", "last", "split", "all")] + [
    {"ties": "split", "nan": n} for n in ("zero", "nan")] + [{"ties": "all", "nan": "zero"}] + [
    {"convention": "torch"}, {"convention": "jax"}]
# (nan="each" is left out: the NumPy module's own _weight reads an undefined name there)


def _same(got, want, what):
    """Equal bits (every NaN taken as NaN), signs of zero included."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    nan = np.isnan(want.astype(np.float64))
    assert np.array_equal(np.isnan(got.astype(np.float64)), nan), (what, got, want)
    bits = f"u{want.dtype.itemsize}"
    assert np.array_equal(got[~nan].view(bits), want[~nan].view(bits)), (what, got, want)


def _params(op, include_self=True, dim=0):
    return {"num_segments": 5} if op.startswith("segment") else {"dim": dim, "include_self": include_self}


def _inputs(op, rng, dim=0):
    """The forward inputs (float64 NumPy arrays and the int64 index) and the output's shape."""
    def tie_heavy(shape):
        return rng.choice(VALUES, size=shape)
    if op.startswith("segment"):
        data = tie_heavy((13, 3))
        return (data, rng.integers(0, 5, 13)), (5, 3)
    src = np.moveaxis(tie_heavy((4, 9)), 0, dim)
    index = np.moveaxis(rng.integers(0, 3, (4, 9)), 0, dim)
    inp = np.moveaxis(tie_heavy((3, 9)), 0, dim)
    return (inp, index, src), inp.shape


def _numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _converters(backend, dtype):
    """(NumPy array -> the backend's array of dtype (an index as it is), the backend's result ->
    NumPy array of dtype)."""
    np_dtype = _numpy_dtype(dtype)
    if backend == "jax":
        import jax.numpy as jnp
        return ((lambda a: jnp.asarray(a.astype(np_dtype) if a.dtype.kind == "f" else a)),
                (lambda r: np.asarray(r)))
    t_dtype = getattr(torch, dtype)
    return ((lambda a: torch.tensor(a.astype(np.float64), dtype=t_dtype) if a.dtype.kind == "f" else torch.tensor(a)),
            (lambda t: _dtype_checked(t, t_dtype).to(torch.float64).numpy().astype(np_dtype)))


def _dtype_checked(t, dtype):
    assert t.dtype == dtype, (t.dtype, dtype)
    return t


def _compare(backend, op, policy, dtype, rng, include_self=True, dim=0):
    """forward, backward and jvp of the backend's module equal the NumPy module's, bit for bit."""
    params = _params(op, include_self, dim)
    want_mod = symgrad.load(op, backend="numpy", **policy, **params)
    got_mod = symgrad.load(op, backend=backend, **policy, **params)
    forward, backward, jvp = got_mod.forward, got_mod.backward, got_mod.jvp
    if backend == "jax":  # traced whole (no branch on array values): one compile, not one per op
        import jax
        forward, backward, jvp = jax.jit(forward), jax.jit(backward), jax.jit(jvp)
    np_dtype = _numpy_dtype(dtype)
    to, back = _converters(backend, dtype)

    def as_np(a):
        return a.astype(np_dtype) if a.dtype.kind == "f" else a
    inputs, out_shape = _inputs(op, rng, dim)
    want, want_saved = want_mod.forward(*map(as_np, inputs))
    got, got_saved = forward(*map(to, inputs))
    _same(back(got), want, "output")
    g = rng.choice([1.0, -3.0, 0.0, -0.0, 7.0, 0.5, 0.1], out_shape)
    for a, b in zip(backward(to(g), got_saved), want_mod.backward(as_np(g), want_saved)):
        assert (a is None) == (b is None)
        if b is not None:
            _same(back(a), b, "backward")
    tangents = [None if i.dtype.kind in "iu" else rng.choice([1.0, -2.0, 0.25, -0.0, 0.1, 3.0], i.shape)
                for i in inputs]
    want_t = want_mod.jvp(*[None if t is None else as_np(t) for t in tangents], want_saved)
    got_t = jvp(*[None if t is None else to(t) for t in tangents], got_saved)
    _same(back(got_t), want_t, "jvp")


def _torch_compare(*args, **kwargs):
    _compare("torch", *args, **kwargs)


def _jax_compare(*args, **kwargs):
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        _compare("jax", *args, **kwargs)


# the default run: a representative set (each module is generated once per session); every
# op, policy, NaN rule, preset, dtype, include_self and dim under -m slow
REPRESENTATIVE = [  # (op, policy, dtype, include_self, dim)
    ("scatter_max", {"ties": "first"}, "float32", True, 0),
    ("scatter_max", {"ties": "last"}, "float64", False, 0),
    ("scatter_max", {"ties": "split"}, "float32", False, 0),
    ("scatter_max", {"convention": "torch"}, "bfloat16", False, 0),
    ("scatter_min", {"ties": "all", "nan": "zero"}, "float64", True, 1),
    ("segment_max", {"convention": "jax"}, "float16", True, 0),
    ("segment_min", {"ties": "split", "nan": "nan"}, "float32", True, 0),
]


@pytest.mark.parametrize("case", REPRESENTATIVE, ids=lambda c: f"{c[0]}-{'-'.join(c[1].values())}-{c[2]}")
def test_torch_module_equals_the_numpy_module(case):
    op, policy, dtype, include_self, dim = case
    rng = np.random.default_rng(0)
    for _ in range(3):
        _torch_compare(op, policy, dtype, rng, include_self, dim)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("op", ["scatter_max", "scatter_min", "segment_max", "segment_min"])
def test_torch_module_every_variant(op, policy, dtype):
    rng = np.random.default_rng(3)
    for include_self in ((True, False) if op.startswith("scatter") else (True,)):
        for dim in ((0, 1) if op.startswith("scatter") else (0,)):
            for _ in range(4):
                _torch_compare(op, policy, dtype, rng, include_self, dim)


@pytest.mark.parametrize("case", [REPRESENTATIVE[2], pytest.param(REPRESENTATIVE[5], marks=pytest.mark.slow)],
                         ids=lambda c: f"{c[0]}-{'-'.join(c[1].values())}-{c[2]}")
def test_jax_module_equals_the_numpy_module(case):
    op, policy, dtype, include_self, dim = case
    _jax_compare(op, policy, dtype, np.random.default_rng(4), include_self, dim)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("op", ["scatter_max", "scatter_min", "segment_max", "segment_min"])
def test_jax_module_every_variant(op, policy, dtype):
    rng = np.random.default_rng(6)
    for include_self in ((True, False) if op.startswith("scatter") else (True,)):
        for dim in ((0, 1) if op.startswith("scatter") else (0,)):
            for _ in range(4):
                _jax_compare(op, policy, dtype, rng, include_self, dim)


# ----------------------------------------------------------------------------- framework ops

def _bits_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


def _graph(rng, nodes=12, features=3, graphs=4):
    """Node features with ties, +-0 and -inf, and the graph of each node (graph 3 left empty)."""
    x = rng.choice([0.0, -0.0, 1.0, 1.0, 2.0, -np.inf, -1.0], size=(nodes, features)).astype(np.float32)
    return torch.tensor(x), torch.tensor(rng.integers(0, graphs - 1, nodes)), graphs


def _pyg_global_max_pool(x, batch, size):
    """PyG's global_max_pool: scatter(x, batch, dim=0, dim_size=size, reduce="max"), which is
    x.new_zeros(size, F).scatter_reduce(0, batch expanded, x, "amax", include_self=False)."""
    index = batch[:, None].expand_as(x)
    return x.new_zeros((size,) + tuple(x.shape[1:])).scatter_reduce(0, index, x, "amax", include_self=False)


def _value_and_grad(fn, x, g):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    (gx,) = torch.autograd.grad(y, x, g)
    return y.detach().numpy(), gx.numpy()


def test_global_max_pool_is_pygs_under_the_torch_preset(monkeypatch):
    """symgrad.torch.GlobalMaxPool(convention="torch") equals PyG's global_max_pool (PyTorch's
    scatter_reduce) bit for bit, output and gradient, with ties, +-0, -inf and an empty graph; under
    ties="first" each graph's gradient goes to its first maximum (a loop from the definition)."""
    import symgrad.torch as st
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", "numpy")  # (the cpu backend's C is test_segment_cpu's)
    x, batch, size = _graph(np.random.default_rng(7))
    g = torch.tensor(np.random.default_rng(8).choice([1.0, -2.0, 0.5, 3.0], (size, x.shape[1])), dtype=torch.float32)
    want = _value_and_grad(lambda t: _pyg_global_max_pool(t, batch, size), x, g)
    got = _value_and_grad(lambda t: st.GlobalMaxPool(convention="torch")(t, batch, size), x, g)
    assert _bits_equal(got[0], want[0]) and _bits_equal(got[1], want[1])
    y, gx = _value_and_grad(lambda t: st.GlobalMaxPool(ties="first")(t, batch, size), x, g)
    expected = np.zeros_like(gx)
    for j in range(int(batch.max()) + 1):  # (graph size - 1 has no node)
        for c in range(x.shape[1]):
            nodes = [i for i in range(x.shape[0]) if batch[i] == j]
            best = max(float(x[i, c]) for i in nodes)
            expected[next(i for i in nodes if float(x[i, c]) == best), c] = g[j, c]
    assert np.array_equal(gx, expected)


def test_symgrad_torch_scatter_max_runs_the_torch_module():
    """symgrad.torch.op("scatter_max") holds the torch backend's module (the path of torch.compile
    and of every device): through it, output and gradient equal scatter_reduce's bit for bit; on
    the meta device GlobalMaxPool runs it (no value is read)."""
    import symgrad.torch as st
    fn = st.op("scatter_max", convention="torch", include_self=False)
    assert fn.torch_module is not None and fn.torch_module.BACKEND == "torch"
    x, batch, size = _graph(np.random.default_rng(9))
    index = batch[:, None].expand_as(x)
    initial = torch.tensor(np.random.default_rng(10).choice([0.0, 1.0, -0.0], (size, x.shape[1])), dtype=torch.float32)
    g = torch.ones(size, x.shape[1])
    want = _value_and_grad(lambda t: initial.scatter_reduce(0, index, t, "amax", include_self=False), x, g)
    native = fn._native[0]  # the autograd.Function around the torch module
    got = _value_and_grad(lambda t: native.apply(initial, index, t), x, g)
    assert _bits_equal(got[0], want[0]) and _bits_equal(got[1], want[1])
    # a device other than the CPU (meta: shapes only, as an accelerator's tensors reach it) runs it
    meta = torch.empty(x.shape, device="meta", requires_grad=True)
    y = st.GlobalMaxPool(convention="torch")(meta, batch.to("meta"), size)
    (gm,) = torch.autograd.grad(y.sum(), meta)
    assert y.device.type == gm.device.type == "meta" and y.shape == (size, x.shape[1]) and gm.shape == x.shape


@pytest.mark.slow
def test_symgrad_torch_scatter_max_compiles_fullgraph():
    """symgrad.torch.op("scatter_max") and GlobalMaxPool under torch.compile(fullgraph=True), from
    the first call: output and gradient equal scatter_reduce's (PyG's global_max_pool) bit for bit."""
    import symgrad.torch as st
    x, batch, size = _graph(np.random.default_rng(11))
    g = torch.tensor(np.random.default_rng(12).choice([1.0, -2.0, 0.5], (size, x.shape[1])), dtype=torch.float32)
    pool = st.GlobalMaxPool(convention="torch")
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: pool(t, batch, size), fullgraph=True)
    want = _value_and_grad(lambda t: _pyg_global_max_pool(t, batch, size), x, g)
    got = _value_and_grad(compiled, x, g)
    assert _bits_equal(got[0], want[0]) and _bits_equal(got[1], want[1])


def test_symgrad_jax_segment_max_is_native_and_jax_ops_segment_max():
    """symgrad.jax.op("segment_max", convention="jax") runs the jax backend's module (no
    callback, and its grad's jaxpr no scatter-add: the backward is a gather): under jit and vmap its
    output equals jax.ops.segment_max's bit for bit (ties, +-0, -inf, an empty segment filled with
    -inf); test_segment.py's test_symgrad_jax_op_is_segment_max
    compares jit(grad) on this op."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import symgrad.jax as sj
    fn = sj.op("segment_max", convention="jax", num_segments=4)
    assert "native" in repr(fn)
    rng = np.random.default_rng(13)
    data = jnp.asarray(rng.choice([0.0, -0.0, 1.0, 1.0, 2.0, -np.inf], size=(2, 10, 3)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, 3, 10))
    ours = lambda d: fn(d, ids)  # noqa: E731
    theirs = lambda d: jax.ops.segment_max(d, ids, num_segments=4)  # noqa: E731
    assert _bits_equal(jax.jit(jax.vmap(ours))(data), jax.vmap(theirs)(data))
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda d: jnp.sum(jnp.where(jnp.isinf(ours(d)), 0.0, ours(d)))))(data[0]))
    added = re.findall(r"([a-z]+)\d*\[[\d,]*\] = scatter-add", jaxpr)
    assert "callback" not in jaxpr and added and all(t in ("i", "u") for t in added), added  # counts only


def _bytes_of_element_passes(fn, n):
    """The bytes that fn's torch operations write into tensors of n elements (one per src element),
    counted with a TorchDispatchMode: each such output is a pass over the elements."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    written = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            written.extend(t.numel() * t.element_size() for t in tree_leaves(out)
                           if isinstance(t, torch.Tensor) and t.numel() == n)
            return out

    with Count():
        fn()
    return sum(written)


@pytest.mark.parametrize("op", ["scatter_max", "segment_min"])
def test_torch_preset_nan_pick_costs_at_most_one_pass_more_than_the_first_hit(op):
    """The torch preset's pick (the first hit, else the last NaN) writes at most one int64 pass
    over the src elements more than ties='first''s pick (the first hit): it searched the NaN with
    three more int64 passes (33 bytes an element against 16), which made the preset's forward
    ~1.5x slower.  Both picks run on the same layout and hits; the picks agree where no segment
    holds a NaN."""
    rng = np.random.default_rng(21)
    (*args,), _ = _inputs(op, rng)
    args = [torch.from_numpy(a) if a.dtype.kind == "i" else torch.from_numpy(a.astype(np.float32)) for a in args]
    preset = symgrad.load(op, backend="torch", convention="torch", **_params(op))
    first = symgrad.load(op, backend="torch", ties="first", **_params(op))
    lay = preset._layout(*args)
    _, _, hit_src, hit_initial = preset._segments(lay)
    n = hit_src.shape[0]
    picks = {}
    cost = {name: _bytes_of_element_passes(lambda m=m, name=name: picks.__setitem__(name, m._picked(lay, hit_src, hit_initial)), n)
            for name, m in (("preset", preset), ("first", first))}
    assert 0 < cost["preset"] <= cost["first"] + 8 * n, (cost, n)
    clean = torch.zeros(lay.initial.shape, dtype=torch.int64).index_add(
        0, lay.key, torch.isnan(lay.src).to(torch.int64)) == 0
    clean &= ~(lay.taking & torch.isnan(lay.initial))
    assert torch.equal(picks["preset"][clean], picks["first"][clean])
