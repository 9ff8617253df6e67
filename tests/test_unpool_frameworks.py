"""The torch and jax backends' unpooling modules (max_unpool1d/2d/3d) against the NumPy module
(itself checked against a Python loop over the indices and PyTorch in test_unpool_logsumexp.py),
bit for bit on the CPU: output, Saved, backward and jvp on inputs holding NaN, +-inf and +-0,
indices with many duplicates (slots written by up to n elements, so the order of the ties='all'
jvp's sums shows), every policy and preset, float16/32/64 and bfloat16, unbatched inputs and
output_size; plain framework code; symgrad.torch / symgrad.jax run these modules natively."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import tokenize

import numpy as np
import pytest

import symgrad
import symgrad.ops
import symgrad.pipeline
from symgrad import backends

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

VALUES = np.array([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan])
POLICIES = [{"ties": "first"}, {"ties": "last"}, {"ties": "all"}, {"convention": "torch"},
            {"convention": "jax"}, {"ties": "first", "convention": "torch"}]
# (op, params, input shape)
GEOMETRIES = [("max_unpool2d", {"kernel_size": 2}, (2, 3, 3, 4)),
              ("max_unpool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 2, 7)),
              ("max_unpool3d", {"kernel_size": 2}, (1, 2, 2, 2, 3)),
              ("max_unpool2d", {"kernel_size": 2, "output_size": (5, 7)}, (3, 2, 3)),  # unbatched
              ]
DTYPES = ("float16", "bfloat16", "float32", "float64")


def _np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _same(got, want, what):
    """Equal bits (every NaN taken as NaN), signs of zero included; dtype and shape equal."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    nan = np.isnan(want.astype(np.float64))
    assert np.array_equal(np.isnan(got.astype(np.float64)), nan), (what, got, want)
    bits = f"u{want.dtype.itemsize}"
    assert np.array_equal(got[~nan].view(bits), want[~nan].view(bits)), (what, got, want)


def _arrays(name, params, shape, dtype, rng):
    """(input, indices, grad_output, tangent) as NumPy arrays: tie-heavy values, and indices in a
    few slots of each plane (many writers per slot) or from all of them."""
    np_mod = symgrad.load(name, **params)
    x = np.where(rng.random(shape) < 0.5, rng.choice(VALUES, shape), rng.standard_normal(shape))
    spatial = np_mod.SPATIAL
    size = int(np.prod(np_mod._output_spatial(shape[-spatial:])))
    top = size if rng.random() < 0.3 else min(size, 3)
    idx = rng.integers(0, top, shape)
    out_shape = np_mod.forward(x, idx)[0].shape
    g = np.where(rng.random(out_shape) < 0.3, rng.choice(VALUES, out_shape), rng.standard_normal(out_shape))
    t = rng.standard_normal(shape) * 3  # finite: the order of the jvp's sums shows in the last bits
    t.ravel()[:2] = [-0.0, np.inf]
    d = _np_dtype(dtype)
    return x.astype(d), idx, g.astype(d), t.astype(d)


def _torch_io(dtype):
    t_dtype = getattr(torch, dtype)

    def to(a):
        if a.dtype.kind in "iu":
            return torch.tensor(a)
        if a.dtype == _np_dtype("bfloat16"):
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())

    def back(t):
        assert t.dtype in (t_dtype, torch.bool, torch.int64), (t.dtype, t_dtype)
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    return to, back, (lambda f: f)


def _jax_io(dtype):
    import jax
    import jax.numpy as jnp
    return (lambda a: jnp.asarray(a)), (lambda r: np.asarray(r)), jax.jit


def _compare(backend, name, params, shape, dtypes=DTYPES, seed=0):
    np_mod = symgrad.load(name, **params)
    mod = symgrad.load(name, backend=backend, **params)
    for dtype in dtypes:
        to, back, jit = (_jax_io if backend == "jax" else _torch_io)(dtype)
        what = f"{backend} {name} {params} {dtype}"
        rng = np.random.default_rng(seed)
        x, idx, g, t = _arrays(name, params, shape, dtype, rng)
        want, s_np = np_mod.forward(x, idx)
        got, saved = jit(mod.forward)(to(x), to(idx))
        _same(back(got), want, f"{what} forward")
        assert np.array_equal(back(saved.indices), s_np.indices), what
        assert (saved.wins is None) == (s_np.wins is None), what
        if s_np.wins is not None:
            assert np.array_equal(back(saved.wins), s_np.wins), f"{what} wins"
        grad_x, grad_i = jit(mod.backward)(to(g), saved)
        assert grad_i is None
        _same(back(grad_x), np_mod.backward(g, s_np)[0], f"{what} backward")
        with np.errstate(invalid="ignore"):
            want_t = np_mod.jvp(t, None, s_np)
        _same(back(jit(mod.jvp)(to(t), None, saved)), want_t, f"{what} jvp")


def _jax_compare(*args, **kwargs):
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        _compare("jax", *args, **kwargs)


def _id(case):
    name, params, shape = case[:3]
    return f"{name}-{'-'.join(f'{k}{v}' for k, v in params.items())}".replace(" ", "")


def _every_variant():
    for name, params, shape in GEOMETRIES:
        for policy in POLICIES:
            yield name, {**params, **policy}, shape


REPRESENTATIVE = [
    ("max_unpool2d", {"kernel_size": 2, "ties": "first"}, (2, 3, 3, 4)),
    ("max_unpool1d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "last"}, (2, 2, 7)),
    ("max_unpool3d", {"kernel_size": 2, "convention": "torch"}, (1, 2, 2, 2, 3)),  # ties "all"
    ("max_unpool2d", {"kernel_size": 2, "output_size": (5, 7), "ties": "all"}, (3, 2, 3)),
]


@pytest.mark.parametrize("case", REPRESENTATIVE, ids=_id)
def test_torch_unpool_equals_the_numpy_module(case):
    _compare("torch", *case)


@pytest.mark.parametrize("case", REPRESENTATIVE[3:], ids=_id)
def test_jax_unpool_equals_the_numpy_module(case):
    _jax_compare(*case, dtypes=("float32",))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("case", list(_every_variant()), ids=_id)
def test_torch_unpool_every_variant(case, seed):
    _compare("torch", *case, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("case", list(_every_variant()), ids=_id)
def test_jax_unpool_every_variant(case, seed):
    _jax_compare(*case, seed=seed)


def _code_only(src: str) -> str:
    """The module's code without comments and strings."""
    return " ".join(t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                    if t.type not in (tokenize.COMMENT, tokenize.STRING)).replace(" . ", ".").replace(" (", "(").replace(" [", "[")


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_unpool_module_is_plain_framework_code(backend):
    """No NumPy on values (jax: the indices' range read on the host only where concrete), no
    .item()/.tolist(); the only scatter an integer min/max of positions, and a float scatter-add
    only in the jvp of ties='all'."""
    for ties in ("first", "last", "all"):
        op = symgrad.ops.resolve("max_unpool2d", ties=ties, kernel_size=2)
        ((_, src),) = symgrad.pipeline.render(op, backends.get(backend)).items()
        code = _code_only(src)
        for bad in (".numpy(", ".item()", ".tolist()", ".cpu()", "index_put", "import symgrad", "pure_callback"):
            assert bad not in code, (backend, ties, bad)
        if backend == "torch":
            assert "import numpy" not in code and code.count("scatter") == 1, ties
            assert code.count("index_add") == (ties == "all"), ties
        else:
            assert code.count(".at[") == 1 + (ties == "all"), ties


@pytest.mark.parametrize("backend", ["torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_unpool_module_refuses_bad_input_in_one_line(backend):
    mod = symgrad.load("max_unpool2d", backend=backend, kernel_size=2, ties="first")
    if backend == "torch":
        arr, ints = (lambda a: torch.tensor(a, dtype=torch.float32)), torch.tensor
    else:
        import jax.numpy as jnp
        arr, ints = (lambda a: jnp.asarray(a, jnp.float32)), jnp.asarray
    x = arr(np.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match=r"indices must be in \[0, 16\)") as info:
        mod.forward(x, ints(np.array([[[[0, 1], [2, 16]]]])))
    assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match="indices must be an integer"):
        mod.forward(x, x)
    with pytest.raises(ValueError, match="indices must have the input's shape"):
        mod.forward(x, ints(np.zeros((1, 1, 2), dtype=np.int64)))
    y, saved = mod.forward(x, ints(np.zeros((1, 1, 2, 2), dtype=np.int64)))
    with pytest.raises(ValueError, match="grad_output must have the shape"):
        mod.backward(arr(np.ones((1, 1, 4, 3))), saved)
    with pytest.raises(ValueError, match="tangent_indices must be None"):
        mod.jvp(x, x, saved)


@pytest.mark.slow  # (symgrad.torch's import: about 6 s)
@pytest.mark.parametrize("kw", [{"convention": "torch"}, {"ties": "first"}])
def test_symgrad_torch_runs_the_torch_unpool_natively(kw):
    """symgrad.torch's unpooling holds the torch module; its autograd.Function (eager form, as
    every non-CPU device takes it): forward, backward, double backward (the jvp) and forward-mode
    AD against the NumPy module bit for bit, under 'first' (wins saved) and 'all' (wins None); on
    the meta device the shapes."""
    import torch.autograd.forward_ad as fwAD

    import symgrad.torch as st
    fn = st.op("max_unpool2d", kernel_size=2, **kw)
    assert fn.torch_module is not None and fn.torch_module.OP == "max_unpool2d"
    mod = symgrad.load("max_unpool2d", kernel_size=2, **kw)
    x, idx, g, t = _arrays("max_unpool2d", {"kernel_size": 2, **kw}, (2, 3, 3, 4), "float32",
                           np.random.default_rng(3))
    xt = torch.tensor(x, requires_grad=True)
    y = fn._native[0].apply(xt, torch.tensor(idx))
    y_np, saved = mod.forward(x, idx)
    _same(y.detach().numpy(), y_np, f"{kw} forward")
    gt = torch.tensor(g, requires_grad=True)
    (gx,) = torch.autograd.grad(y, xt, gt, create_graph=True)
    _same(gx.detach().numpy(), mod.backward(g, saved)[0], f"{kw} backward")
    # d<backward(g), t>/dg = jvp(t), autograd's sums (a +0 from each writer that did not stay
    # added to the one that did) aside: so t without -0 here
    t_plus = np.where(t == 0, np.float32(0), t)
    (ggt,) = torch.autograd.grad(gx, gt, torch.tensor(t_plus))
    _same(ggt.numpy(), mod.jvp(t_plus, None, saved), f"{kw} double backward")
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.tensor(x), torch.tensor(t))
        tangent = fwAD.unpack_dual(fn._native[0].apply(dual, torch.tensor(idx))).tangent
    _same(tangent.numpy(), mod.jvp(t, None, saved), f"{kw} forward-mode")
    m = torch.empty(2, 3, 3, 4, device="meta", requires_grad=True)
    y = st.MaxUnpool2d(2, **kw)(m, torch.zeros(2, 3, 3, 4, dtype=torch.int64, device="meta"))
    assert y.device.type == "meta" and tuple(y.shape) == (2, 3, 6, 8)


def test_symgrad_jax_runs_the_jax_unpool_natively():
    """symgrad.jax's unpooling is the jax module: no callback in the jaxpr of jit(grad); grad
    equals the NumPy module's backward; vmap of grad equals a loop over examples."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import symgrad.jax as sj
    fn = sj.op("max_unpool2d", kernel_size=2, convention="torch")
    mod = symgrad.load("max_unpool2d", kernel_size=2, convention="torch")
    x, idx, g, _ = _arrays("max_unpool2d", {"kernel_size": 2, "convention": "torch"}, (2, 3, 3, 4),
                           "float32", np.random.default_rng(4))
    x = np.nan_to_num(x, nan=0.5)

    def loss(x, idx, g):
        return jnp.sum(fn(x, idx) * g)
    grad = jax.jit(jax.grad(loss))
    assert "callback" not in str(jax.make_jaxpr(grad)(x, idx, g))
    _same(grad(x, idx, g), mod.backward(g, mod.forward(x, idx)[1])[0], "grad")
    batched = jax.vmap(grad)(x[:, None], idx[:, None], g[:, None])
    looped = np.stack([grad(x[k:k + 1], idx[k:k + 1], g[k:k + 1]) for k in range(2)])
    _same(batched, looped, "vmap of grad")


@pytest.mark.slow  # (Inductor: about two minutes on the loaded 2-core machine)
def test_torch_unpool_compiles_fullgraph_in_a_fresh_process():
    """torch.compile(fullgraph=True) of MaxUnpool2d(MaxPool2d(return_indices)) before any eager
    call, backward through it: the same bits as eager (signs of zero included), on the native path."""
    code = textwrap.dedent("""
        import numpy as np, torch, symgrad.torch as st
        pool, unpool = st.MaxPool2d(2, return_indices=True), st.MaxUnpool2d(2, convention="torch")
        def model(x):
            return unpool(*pool(x))
        a = np.random.default_rng(0).choice([0.0, -0.0, 1.0, 2.0], (2, 3, 6, 8))
        g = torch.tensor(np.random.default_rng(1).choice([0.0, -0.0, 1.5, -2.0], (2, 3, 6, 8)))
        runs = []
        for fn in (torch.compile(model, fullgraph=True), model):
            x = torch.tensor(a, requires_grad=True)
            y = fn(x)
            y.backward(g)
            runs.append((y.detach().view(torch.int64), x.grad.view(torch.int64)))
        (y, gx), (y_e, gx_e) = runs
        assert torch.equal(y, y_e) and torch.equal(gx, gx_e)
        assert unpool.fn.torch_module is not None
        print("ok")""")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
