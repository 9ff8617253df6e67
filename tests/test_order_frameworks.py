"""Order statistics (issue 29, item 3) in the framework backends: the torch and jax backends'
modules of sort, topk, cummax, cummin, kthvalue, median and nanmedian against the NumPy
backend's module (itself checked against a brute-force W and the frameworks in test_order.py and
test_median.py), bit for bit on the CPU: forward values and indices, backward and jvp, every
policy, NaN rule and preset, float16/32/64 and bfloat16, signs of zero included, on tie-heavy
inputs with NaN, +-inf and +-0.  The JAX modules run under jax.jit (each new shape and dtype
compiles, a few seconds on a loaded 2-core machine): the default run holds a few representative
variants (rank, prefix and one-rank bodies; one winner, tie blocks, JAX's tree, the midpoint) on
few shapes and dtypes; -m slow every variant (the JAX ones on fewer shapes).
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from conftest import same_values

ml_dtypes = pytest.importorskip("ml_dtypes")

POOL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan, 0.5])
GRADS = np.array([1.0, -2.0, 0.5, 3.0, -0.25, -0.0, 1 / 3])
TANGENTS = np.array([1.0, -2.0, 0.5, 4.0, -0.0, 0.1])
DTYPES = (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)
# (op, params): each layout (dim last or not, keepdim, every element one row)
CASES = [("sort", {}), ("sort", {"descending": True, "dim": 0}), ("topk", {"k": 3}),
         ("topk", {"k": 2, "largest": False, "dim": 0}), ("cummax", {"dim": 1}), ("cummin", {"dim": 0}),
         ("kthvalue", {"k": 2, "dim": 1}), ("median", {"dim": 1}), ("median", {}),
         ("median", {"dim": 0, "keepdim": True}), ("nanmedian", {"dim": 1}), ("nanmedian", {})]
NANS = {"sort": ["largest"], "topk": ["largest"], "cummax": ["dominate", "zero"], "cummin": ["dominate", "zero"],
        "kthvalue": ["largest"], "median": ["dominate", "propagate"], "nanmedian": ["omit", "omit_zero"]}
# shapes: ties in short rows, rows past NumPy's pairwise-sum block (128), rows of one, 0-d
SHAPES = ((3, 7), (4, 5), (2, 150), (5, 1), (1, 9), ())


def _settings():
    """Every (op, params, settings) that loads: each policy under each NaN rule, and the presets."""
    out = []
    for name, params in CASES:
        out += [(name, params, {"convention": c}) for c in ("torch", "jax")]
        out += [(name, params, {"ties": t, "nan": n}) for t in ("first", "last", "split", "all")
                for n in NANS[name] if not (n == "zero" and t in ("first", "last"))]
    return out


def _id(case) -> str:
    name, params, settings = case
    return "-".join([name] + [f"{k}={v}" for k, v in {**params, **settings}.items()])


# one variant of each body and partial: rank first/last and blocks (written, added, negated
# gradients), prefix one winner, blocks (NaN rule 'zero') and JAX's tree, one rank single, pair
# and blocks (NaN sends nothing), every element one row
REPRESENTATIVE = {"topk-k=3-ties=split-nan=largest", "cummin-dim=0-convention=torch", "cummax-dim=1-convention=jax",
                  "median-dim=1-convention=jax", "nanmedian-dim=1-ties=split-nan=omit_zero"}
JAX_REPRESENTATIVE = set()  # (each jitted variant compiles for seconds: -m slow; the default run
# has test_the_jaxpr_of_a_jitted_grad_holds_no_callback)


def _variants(representative):
    return [pytest.param(*c, id=_id(c), marks=() if _id(c) in representative else pytest.mark.slow)
            for c in _settings()]


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _compare(module, framework, to_framework, to_numpy, shapes, dtypes, seed=0, run=lambda f: f):
    """Forward (values, indices), backward and jvp of the framework module against the NumPy
    module on tie-heavy inputs; the list of what differs."""
    rng = np.random.default_rng(seed)
    bad = []
    for dtype in dtypes:
        for shape in shapes:
            x = rng.choice(POOL, size=shape).astype(dtype)
            try:
                out, saved = module.forward(x)
            except ValueError as exc:  # k past a row's length, an empty row: the same one-line error
                with pytest.raises(ValueError) as info:
                    framework.forward(to_framework(x))
                assert str(info.value) == str(exc)
                continue
            f_out, f_saved = run(framework.forward)(to_framework(x))
            g = rng.choice(GRADS, size=_outputs(out)[0].shape).astype(dtype)
            t = rng.choice(TANGENTS, size=x.shape).astype(dtype)
            pairs = [(f"output {k}", a, b) for k, (a, b) in enumerate(zip(_outputs(out), _outputs(f_out)))]
            pairs += [("backward", module.backward(g, saved)[0], run(framework.backward)(to_framework(g), f_saved)[0]),
                      ("jvp", module.jvp(t, saved), run(framework.jvp)(to_framework(t), f_saved))]
            for what, want, got in pairs:
                got = to_numpy(got)
                if not same_values(got, want):
                    bad.append(f"{np.dtype(dtype).name} {shape} {what}: got {got.tolist()}, want {want.tolist()}")
    return bad


# ----------------------------------------------------------------------------- torch backend

def _torch():
    return pytest.importorskip("torch")


def _to_torch(a):
    torch = _torch()
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def _from_torch(t):
    torch = _torch()
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


@pytest.mark.parametrize("name,params,settings", _variants(REPRESENTATIVE))
def test_torch_backend_module_equals_the_numpy_module(name, params, settings):
    module = symgrad.load(name, **settings, **params)
    framework = symgrad.load(name, backend="torch", **settings, **params)
    assert _compare(module, framework, _to_torch, _from_torch, SHAPES, DTYPES) == []


# ----------------------------------------------------------------------------- jax backend

def _jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)  # float64 inputs, int64 indices, the tie blocks' sums
    return jax


def _to_jax(a):
    return _jax().numpy.asarray(a)


def _from_jax(a):
    return np.asarray(a)


@pytest.mark.parametrize("name,params,settings", _variants(JAX_REPRESENTATIVE))
def test_jax_backend_module_equals_the_numpy_module(name, params, settings, request):
    """Under jax.jit: float32 on a (3, 7) input in the default run; -m slow every dtype on short
    rows, rows of 150 and 0-d."""
    jax = _jax()
    module = symgrad.load(name, **settings, **params)
    framework = symgrad.load(name, backend="jax", **settings, **params)
    slow = request.node.get_closest_marker("slow") is not None
    shapes, dtypes = ((3, 7), (2, 150), ()) if slow else ((3, 7),), DTYPES if slow else (np.float32,)
    assert _compare(module, framework, _to_jax, _from_jax, shapes, dtypes, run=jax.jit) == []


# ----------------------------------------------------------------------------- framework ops

def _bits_equal(got, want) -> bool:
    return same_values(np.asarray(got), np.asarray(want))


def _torch_cases(torch):
    """(op, params, PyTorch's function, whether its indices and gradient are the preset's bit for
    bit: torch.topk/kthvalue order ties by their selection algorithm, so only the values and each
    tie block's total gradient are compared there, as test_order.py and test_median.py do)."""
    return [("sort", {"dim": 1}, lambda t: torch.sort(t, dim=1), True),
            ("cummax", {"dim": 1}, lambda t: torch.cummax(t, 1), True),
            ("cummin", {"dim": 0}, lambda t: torch.cummin(t, 0), True),
            ("median", {"dim": 1}, lambda t: torch.median(t, 1), True),
            ("nanmedian", {"dim": 1}, lambda t: torch.nanmedian(t, 1), True),
            ("median", {}, lambda t: (torch.median(t),), True),
            ("topk", {"k": 3}, lambda t: torch.topk(t, 3), False),
            ("kthvalue", {"k": 4, "dim": 1}, lambda t: torch.kthvalue(t, 4, 1), False)]


def _key_of(v: float):
    return (1, 0.0) if np.isnan(v) else (0, v + 0.0)


def _block_totals(x, grad) -> list:
    """Each row's tie blocks' total gradients (by the total-order key)."""
    x, grad = x.reshape(-1, x.shape[-1]), grad.reshape(-1, x.shape[-1])
    return [{k: sum(g for e, g in zip(row, grow) if _key_of(e) == k) for k in {_key_of(e) for e in row}}
            for row, grow in zip(x, grad)]


@pytest.mark.parametrize("case", [pytest.param(k, marks=() if k == 2 else pytest.mark.slow) for k in range(8)],
                         ids=["sort", "cummax", "cummin", "median_dim", "nanmedian_dim", "median", "topk", "kthvalue"])
def test_symgrad_torch_ops_against_pytorch(case):
    """symgrad.torch.op of each order statistic under the torch preset (the torch backend's module
    in an autograd.Function, on the CPU too): values, indices, x.grad and the forward-mode
    tangent against PyTorch's own op on tie-heavy float32 input with NaN, +-inf and +-0."""
    torch = _torch()
    import symgrad.torch as st
    rng = np.random.default_rng(3)
    for name, params, fn, exact in _torch_cases(torch)[case:case + 1]:
        op = st.op(name, convention="torch", **params)
        for trial in range(3):
            # (tied +0 and -0: which one torch.topk/kthvalue return is their algorithm's)
            x = rng.choice(POOL if trial and exact else POOL[POOL != 0], size=(4, 9)).astype(np.float32)
            mine = torch.tensor(x, requires_grad=True)
            theirs = torch.tensor(x, requires_grad=True)
            got, want = _outputs(op(mine)), _outputs(fn(theirs))
            g = torch.tensor(rng.choice(GRADS[:5], size=tuple(want[0].shape)).astype(np.float32))
            got[0].backward(g)
            want[0].backward(g)
            assert _bits_equal(got[0].detach().numpy(), want[0].detach().numpy()), (name, x)
            if not exact:
                assert _block_totals(x, mine.grad.numpy()) == _block_totals(x, theirs.grad.numpy()), (name, x)
                continue
            if len(want) > 1:
                assert np.array_equal(got[1].numpy(), want[1].numpy()), (name, x)
            assert _bits_equal(mine.grad.numpy(), theirs.grad.numpy()), (name, x, mine.grad, theirs.grad)
            if "dim" not in params:  # (torch.median()'s own jvp is not its backward's transpose: test_median.py)
                continue
            t = torch.tensor(rng.choice(TANGENTS[:4], size=x.shape).astype(np.float32))
            import torch.autograd.forward_ad as fwad  # (symgrad.torch's Function has jvp, not setup_context)
            with fwad.dual_level():
                mine_t = fwad.unpack_dual(_outputs(op(fwad.make_dual(torch.tensor(x), t)))[0]).tangent
            _, their_t = torch.func.jvp(lambda a: _outputs(fn(a))[0], (torch.tensor(x),), (t,))
            assert _bits_equal(mine_t.numpy(), their_t.numpy()), (name, x)


@pytest.mark.slow
def test_symgrad_torch_ops_compile_fullgraph_from_the_first_call():
    """torch.compile(fullgraph=True) traces forward and backward of the ops from their first call
    (no graph break, no registered operator: the torch backend's module), with the eager bits."""
    torch = _torch()
    import symgrad.torch as st
    x = np.array([[1.0, 1.0, np.nan, -0.0, 0.0, 2.0], [3.0, 3.0, 3.0, 1.0, -np.inf, 0.5]], np.float32)
    for name, kw in (("topk", {"k": 2, "ties": "split"}), ("cummin", {"dim": 1, "convention": "jax"})):
        op = st.op(name, **kw)

        def f(a):
            values = op(a)[0]
            return values, (values * values).sum()
        results = []
        for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):  # (AOT traces the backward too)
            a = torch.tensor(x, requires_grad=True)
            values, loss = fn(a)
            loss.backward()
            results.append((values.detach().numpy(), a.grad.numpy()))
        for got, want in zip(results[1], results[0]):
            assert _bits_equal(got, want), name


def _jax_cases(jnp, lax):
    """(op, params, JAX's function of the values, of the indices or None)."""
    return [("sort", {"dim": 1}, lambda a: jnp.sort(a, axis=1), lambda a: jnp.argsort(a, axis=1)),
            ("topk", {"k": 3}, lambda a: lax.top_k(a, 3)[0], lambda a: lax.top_k(a, 3)[1]),
            ("cummax", {"dim": 1}, lambda a: lax.cummax(a, axis=1), None),
            ("cummin", {"dim": 0}, lambda a: lax.cummin(a, axis=0), None),
            ("median", {"dim": 1}, lambda a: jnp.median(a, axis=1), None)]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(5), ids=["sort", "top_k", "cummax", "cummin", "median"])
def test_symgrad_jax_ops_against_jax(case):
    """symgrad.jax.op of each order statistic under the jax preset (native: the jax backend's
    module traced in place), jitted: values, indices, jax.grad's vjp and jax.jvp against
    jnp.sort, lax.top_k, lax.cummax/cummin and jnp.median on tie-heavy float32 input with NaN,
    +-inf and +-0; and vmap of the jitted gradient against JAX's."""
    jax = _jax()
    import jax.numpy as jnp
    from jax import lax
    import symgrad.jax as sj
    name, params, values, indices = _jax_cases(jnp, lax)[case]
    op = sj.op(name, convention="jax", **params)
    def mine_values(a):
        return _outputs(op(a))[0]
    rng = np.random.default_rng(13)
    x = jnp.asarray(rng.choice(POOL, size=(3, 5, 9)).astype(np.float32))
    t = jnp.asarray(rng.choice(TANGENTS[:4], size=x.shape).astype(np.float32))

    def run(f):
        def both(a, da):  # (the values as called: under jax.vjp lax.cummax runs the scan's tree)
            y, pull = jax.vjp(f, a)
            _, dy = jax.jvp(f, (a,), (da,))
            return f(a), pull(jnp.full(y.shape, 0.5, y.dtype))[0], dy
        return jax.jit(jax.vmap(both))(x, t)
    for got, want in zip(run(mine_values), run(values)):
        assert _bits_equal(got, want), (name, got, want)
    if indices is not None:
        assert np.array_equal(np.asarray(jax.vmap(lambda a: op(a)[1])(x)), np.asarray(jax.vmap(indices)(x)))


def test_the_jaxpr_of_a_jitted_grad_holds_no_callback():
    """The order statistics take symgrad.jax's native path: no host callback anywhere in the
    program of a jitted gradient."""
    jax = _jax()
    import jax.numpy as jnp
    import symgrad.jax as sj
    x = jnp.array([[5.0, 5.0, 5.0, 1.0], [0.0, -0.0, jnp.nan, 2.0]])
    for name, params in (("topk", {"k": 2}), ("cummax", {"dim": 1, "convention": "jax"}),
                         ("median", {"dim": 1, "ties": "split"}), ("sort", {"ties": "last"})):
        op = sj.op(name, **params)
        text = str(jax.make_jaxpr(jax.jit(jax.grad(lambda a: op(a)[0].sum())))(x))
        assert "callback" not in text, name
        assert "custom_jvp_call" in text and "sort" in text or name == "cummax"


@pytest.mark.slow  # (JAX compiles forward eagerly: seconds on a loaded machine)
def test_jax_split_without_x64_says_so_in_one_line():
    """The tie blocks' float64 sums need jax_enable_x64: without it backward and jvp raise one
    ValueError naming the setting (never a float32 sum with other bits)."""
    jax = _jax()
    with jax.enable_x64(False):
        module = symgrad.load("topk", backend="jax", k=1, ties="split")
        (values, _), saved = module.forward(jax.numpy.ones(2, jax.numpy.float32))
        for call in (lambda: module.backward(values, saved), lambda: module.jvp(jax.numpy.ones(2), saved)):
            with pytest.raises(ValueError, match="jax_enable_x64") as info:
                call()
            assert "\n" not in str(info.value)
