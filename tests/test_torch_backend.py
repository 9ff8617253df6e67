"""The torch backend (symgrad/backends/torch): its generated modules against the NumPy backend's,
bit for bit on the CPU (forward, backward, jvp; float16, bfloat16, float32, float64; ties, NaN,
+-0, +-inf, signs of zero compared as bit patterns), against PyTorch's own ops under the torch
preset, and the module's contract (plain torch code, one clear error without torch, refusals)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import symgrad  # noqa: E402
import symgrad.ops  # noqa: E402
import symgrad.pipeline  # noqa: E402
import symgrad.policy  # noqa: E402
from symgrad import backends  # noqa: E402

DTYPES = {"float16": (torch.float16, np.float16), "bfloat16": (torch.bfloat16, ml_dtypes.bfloat16),
          "float32": (torch.float32, np.float32), "float64": (torch.float64, np.float64)}

# every elementwise op with the parameters that make its ties reachable
OPS = {"relu": {}, "abs": {}, "relu6": {}, "maximum": {}, "minimum": {},
       "hardtanh": {}, "clamp": {"min": -1.0, "max": 1.0}, "leaky_relu": {},
       "leaky_relu_slope": {"negative_slope": 0.3}}
TIES = ("first", "last", "split", "all")
NANS = tuple(symgrad.policy.NAN_RULES)


def _load(name, backend, **kw):
    op = "leaky_relu" if name == "leaky_relu_slope" else name
    return symgrad.load(op, backend=backend, **OPS[name], **kw)


def _to_numpy(t: torch.Tensor, np_dtype) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _bits(a) -> np.ndarray:
    """The bit patterns of an array, every NaN as one pattern (a NaN's sign and payload are not
    specified by either library)."""
    a = np.asarray(a)
    width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    out = a.view(width).copy()
    out[np.isnan(a.astype(np.float64))] = 0
    return out


def _same(t: torch.Tensor, a: np.ndarray, what: str) -> None:
    assert t is not None and a is not None, what
    got = _to_numpy(t.detach().contiguous(), None)
    assert got.dtype == np.asarray(a).dtype, f"{what}: dtype {got.dtype} != {np.asarray(a).dtype}"
    assert got.shape == np.asarray(a).shape, f"{what}: shape {got.shape} != {np.asarray(a).shape}"
    bad = np.flatnonzero(_bits(got) != _bits(a))
    assert bad.size == 0, (f"{what}: {bad.size} elements differ, first at {bad[0]}: torch "
                           f"{got.ravel()[bad[0]]!r} numpy {np.asarray(a).ravel()[bad[0]]!r}")


# values that tie with each other and with every bound of the ops above (0, +-1, 6, -0.3*x ...)
SPECIAL = [0.0, -0.0, 1.0, -1.0, 6.0, -6.0, 0.5, -0.5, 2.0, -2.0, np.inf, -np.inf, np.nan, 0.01,
           -0.01, 3.0, 1e-3, 65504.0, 1e-8]


def _inputs(n_inputs: int, np_dtype, seed: int = 0, shape=(8, 9)) -> list[np.ndarray]:
    """Arrays built to tie: the special values in every pair (for two inputs), and copies of one
    input into the other, plus random values."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    vals = np.array(SPECIAL, dtype=np.float64)
    if n_inputs == 1:
        x = np.concatenate([vals, rng.standard_normal(size - len(vals)) * 3])[:size]
        out = [x]
    else:
        pairs = np.array(list(itertools.product(vals, vals)))
        a = np.concatenate([pairs[:, 0], rng.standard_normal(size) * 3])
        b = np.concatenate([pairs[:, 1], a[len(pairs):]])  # ties: b == a
        k = len(pairs)
        b[k + size // 2:] = rng.standard_normal(len(b) - k - size // 2)
        out = [a, b]
    return [np.asarray(x, dtype=np.float64).astype(np_dtype) for x in out]


def _check_against_numpy(name, np_mod, th_mod, dtype: str, shapes=None, seed=0) -> None:
    t_dtype, np_dtype = DTYPES[dtype]
    n = len(np_mod.INPUTS)
    arrays = _inputs(n, np_dtype, seed)
    if shapes is not None:  # broadcasting: cut to the shapes
        arrays = [np.ascontiguousarray(np.resize(a, s)) for a, s in zip(arrays, shapes)]
    tensors = [torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16"
               else torch.from_numpy(a) for a in arrays]
    y_np, s_np = np_mod.forward(*arrays)
    y_th, s_th = th_mod.forward(*tensors)
    _same(y_th, y_np, f"{name} {dtype} forward")
    rng = np.random.default_rng(seed + 1)
    g = rng.standard_normal(y_np.shape)
    g.ravel()[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0][:g.size]
    g = g.astype(np_dtype)
    g_t = torch.from_numpy(g.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16" else torch.from_numpy(g)
    for k, (gt, gn) in enumerate(zip(th_mod.backward(g_t, s_th), np_mod.backward(g, s_np))):
        if gn is None:
            assert gt is None
            continue
        _same(gt, gn, f"{name} {dtype} backward[{k}]")
    tangents = [rng.standard_normal(a.shape).astype(np_dtype) for a in arrays]
    tangents_t = [torch.from_numpy(t.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16"
                  else torch.from_numpy(t) for t in tangents]
    differentiated = [gn is not None for gn in np_mod.backward(g, s_np)]
    tangents = [t if d else None for t, d in zip(tangents, differentiated)]
    tangents_t = [t if d else None for t, d in zip(tangents_t, differentiated)]
    _same(th_mod.jvp(*tangents_t, s_th), np_mod.jvp(*tangents, s_np), f"{name} {dtype} jvp")
    if n > 1:  # one tangent only
        one = [tangents[0]] + [None] * (n - 1)
        one_t = [tangents_t[0]] + [None] * (n - 1)
        _same(th_mod.jvp(*one_t, s_th), np_mod.jvp(*one, s_np), f"{name} {dtype} jvp (first input)")


def _valid(name, kw) -> bool:
    try:
        symgrad.ops.resolve("leaky_relu" if name == "leaky_relu_slope" else name, **OPS[name], **kw)
    except ValueError:  # a NaN rule the policy or op does not take
        return False
    return True


def _variants(full: bool):
    for name in OPS:
        for ties in TIES:
            for nan in NANS:
                for order in ("given", "reversed"):
                    if _valid(name, {"ties": ties, "nan": nan, "order": order}):
                        yield name, {"ties": ties, "nan": nan, "order": order}
        for preset in ("torch", "jax"):
            yield name, {"convention": preset}


REPRESENTATIVE = [
    ("relu", {"ties": "split"}), ("relu", {"ties": "first", "nan": "keep"}),
    ("abs", {"ties": "split", "nan": "nan"}), ("relu6", {"ties": "all", "order": "reversed"}),
    ("maximum", {"ties": "split"}), ("minimum", {"ties": "last", "nan": "replace"}),
    ("hardtanh", {"ties": "first", "order": "reversed"}), ("clamp", {"ties": "split", "nan": "zero"}), ("maximum", {"ties": "split", "nan": "each"}),
    ("minimum", {"ties": "first", "nan": "last_nan"}),
    ("leaky_relu", {"ties": "split"}), ("leaky_relu_slope", {"ties": "last"}),
] + [(name, {"convention": preset}) for name in OPS for preset in ("torch", "jax")]


def _run(name, kw, dtypes=tuple(DTYPES)):
    try:
        np_mod = _load(name, "numpy", **kw)
    except ValueError as exc:  # a policy or NaN rule the op does not take
        pytest.skip(str(exc))
    th_mod = _load(name, "torch", **kw)
    for dtype in dtypes:
        _check_against_numpy(name, np_mod, th_mod, dtype)


@pytest.mark.parametrize("name,kw", REPRESENTATIVE, ids=[f"{n}-{'-'.join(map(str, k.values()))}" for n, k in REPRESENTATIVE])
def test_torch_module_equals_numpy_module_bit_for_bit(name, kw):
    _run(name, kw)


@pytest.mark.slow
@pytest.mark.parametrize("name,kw", list(_variants(True)),
                         ids=[f"{n}-{'-'.join(map(str, k.values()))}" for n, k in _variants(True)])
def test_torch_module_equals_numpy_module_every_variant(name, kw):
    _run(name, kw)


@pytest.mark.parametrize("kw", [{"convention": "torch"}, {"ties": "split"}, {"ties": "first"}])
@pytest.mark.parametrize("shapes", [((8, 9), (9,)), ((8, 9), (8, 1)), ((4, 8, 9), (1, 8, 1)), ((2, 9), (9,)),
                                    ((9,), (2, 1))])
def test_broadcast_gradients_equal_numpy(kw, shapes):
    """A broadcast input's gradient is summed as PyTorch's autograd sums it (at::sum_to): under the
    torch preset the NumPy module sums in that order too, bit for bit; under NumPy's own sum rule
    the two agree wherever at most two broadcast copies are added (the module's docstring says
    why more can differ in the last bits)."""
    if "convention" not in kw and max(int(np.prod(s)) for s in shapes) // min(int(np.prod(s)) for s in shapes) > 2:
        pytest.skip("NumPy's pairwise sum order: not reproduced (see the torch module's _sum_to_shape)")
    np_mod, th_mod = _load("maximum", "numpy", **kw), _load("maximum", "torch", **kw)
    for dtype in DTYPES:
        _check_against_numpy("maximum", np_mod, th_mod, dtype, shapes=shapes)


def test_the_module_is_plain_torch_code():
    """No NumPy, no host round trip, no branch on a tensor's values in a generated module."""
    for name, kw in REPRESENTATIVE:
        op = "leaky_relu" if name == "leaky_relu_slope" else name
        ((_, src),) = symgrad.pipeline.render(symgrad.ops.resolve(op, **OPS[name], **kw),
                                              backends.get("torch")).items()
        for bad in ("import numpy", ".numpy(", ".item()", ".tolist()", ".cpu()", "import symgrad"):
            assert bad not in src, (name, kw, bad)
        assert "BACKEND = \"torch\"" in src and src.startswith("# Generated by symgrad")


def test_generation_is_deterministic():
    op = symgrad.ops.resolve("leaky_relu", "split", negative_slope=0.3)
    a = symgrad.pipeline.render(op, backends.get("torch"))
    b = symgrad.pipeline.render(symgrad.ops.resolve("leaky_relu", "split", negative_slope=0.3),
                                backends.get("torch"))
    assert a == b


def test_a_variant_it_refuses_is_refused_in_one_line():
    """Every kernel form is built (RoI pooling and logsumexp since issues 32 and 33); segment_max
    without num_segments reads the output's size from the ids' values, which it refuses."""
    with pytest.raises(ValueError, match=r"^segment_max: the torch backend builds segments with num_segments given "
                                         r"only .*backend='numpy'") as info:
        symgrad.load("segment_max", backend="torch")
    assert "\n" not in str(info.value)


def test_templates_place_finished_strings():
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_render import _template_decisions
    assert _template_decisions([Path(backends.get("torch").templates)]) == []


EXPRESSIONS = (("Max(x*y, x + y, 0)", ["x", "y"], None),
               ("Min(Max(x, 0.3*y), 2) - Abs(x)/3", ["x", "y"], ["x"]),
               ("Max(x, 0)*Heaviside(x - 1) + 0.1*x", ["x"], None),
               ("3/(1 + Max(x, 0))", ["x"], None),
               ("Heaviside(x)*y + sign(x - y)", ["x", "y"], None),  # grad_x is the constant 0
               ("abs(x) + Min(x, 1)", ["x"], None),
               ("Piecewise((x, x > 1), (2*y, True))", ["x", "y"], None))


def _expressions(ties):
    for text, inputs, wrt in EXPRESSIONS:
        np_mod = symgrad.load_expr(text, inputs=inputs, wrt=wrt, ties=ties)
        th_mod = symgrad.load_expr(text, inputs=inputs, wrt=wrt, ties=ties, backend="torch")
        for dtype in DTYPES:
            _check_against_numpy(text, np_mod, th_mod, dtype)


def test_expressions_equal_numpy():
    """User expressions (lower_expression): forward, backward (None outside wrt) and jvp, bit for
    bit, arithmetic, max/min, abs, sign, Heaviside and Piecewise (exp, log, sin, ... are each
    library's own: "max(x, 0) * exp(y)" differs in the last bit, 59 of 72 float32 outputs)."""
    _expressions("split")


@pytest.mark.slow
@pytest.mark.parametrize("ties", TIES)
def test_expressions_equal_numpy_every_policy(ties):  # (expressions take the NaN rule dominate only)
    _expressions(ties)


def test_generate_and_load_from_the_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "symgrad", "generate", "relu", "--ties", "split",
                          "--backend", "torch", "--out", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (path,) = tmp_path.glob("*.py")
    assert "--backend torch" in path.read_text()
    mod = symgrad.load("relu", backend="torch", ties="split")
    y, saved = mod.forward(torch.tensor([-1.0, 0.0, 2.0]))
    assert mod.backward(torch.ones(3), saved)[0].tolist() == [0.0, 0.5, 1.0]
    assert mod.BACKEND == "torch"


def test_a_missing_torch_is_one_clear_error(tmp_path):
    """The generated module's import names what to install."""
    ((name, src),) = symgrad.pipeline.render(symgrad.ops.resolve("relu", "split"), backends.get("torch")).items()
    (tmp_path / name).write_text(src)
    (tmp_path / "torch.py").write_text("raise ModuleNotFoundError('No module named torch', name='torch')\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        try:
            import {name[:-3]}
        except ModuleNotFoundError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert 'pip install ".[torch]"' in out.stdout and "needs PyTorch" in out.stdout, out.stdout + out.stderr
    assert len(out.stdout.strip().splitlines()) == 1


def _torch_ops():
    F = torch.nn.functional
    return {"relu": torch.relu, "abs": torch.abs, "relu6": F.relu6, "hardtanh": F.hardtanh,
            "clamp": lambda x: torch.clamp(x, -1.0, 1.0), "leaky_relu": F.leaky_relu,
            "leaky_relu_slope": lambda x: F.leaky_relu(x, 0.3), "maximum": torch.maximum,
            "minimum": torch.minimum}


@pytest.mark.parametrize("name", list(OPS))
def test_torch_preset_equals_torchs_own_ops(name):
    """Under the torch preset the torch module's forward and backward are PyTorch's op and its
    autograd backward, bit for bit, at ties, +0 and +-inf, in every dtype; away from NaN and -0, as
    tests/test_torch.py checks the NumPy module (PyTorch's maximum returns either zero by its SIMD
    width and input size, and its hardtanh/relu6 backward pass a NaN's gradient on: the preset
    does not follow those)."""
    mod, ref = _load(name, "torch", convention="torch"), _torch_ops()[name]
    for dtype, (t_dtype, np_dtype) in DTYPES.items():
        arrays = _inputs(len(mod.INPUTS), np_dtype)
        arrays = [np.where(np.isnan(a) | ((a == 0) & np.signbit(a)), np_dtype(0.25), a) for a in arrays]
        xs = [torch.from_numpy(a.astype(np.float64)).to(t_dtype) for a in arrays]
        leaves = [x.clone().requires_grad_(True) for x in xs]
        want = ref(*leaves)
        g = torch.linspace(-3, 3, want.numel(), dtype=torch.float64).reshape(want.shape).to(t_dtype)
        want_grads = torch.autograd.grad(want, leaves, g)
        got, saved = mod.forward(*xs)
        _same(got, _to_numpy(want.detach(), None), f"{name} {dtype} forward")
        for k, (a, b) in enumerate(zip(mod.backward(g, saved), want_grads)):
            _same(a, _to_numpy(b, None), f"{name} {dtype} backward[{k}]")


# ----------------------------------------------------------------------------- window ops
# pooling (windows "strided"): forward a fold over the window's strided slices, backward in gather
# form; against the NumPy module bit for bit (its own tests check it against brute force, the
# SymPy derivation at ties and PyTorch/JAX under the presets)

POOLS = [("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 9)),
         ("max_pool1d", {"kernel_size": 4, "stride": 1, "padding": 2, "dilation": 2, "ceil_mode": True}, (2, 2, 11)),
         ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 7, 6)),
         ("max_pool2d", {"kernel_size": 2}, (2, 6, 6)),  # disjoint windows (the NumPy module's write path)
         ("max_pool2d", {"kernel_size": 2}, (2, 3, 7, 5)),  # windows tiling the input, a row and a column in none
         ("max_pool2d", {"kernel_size": (2, 3), "stride": (2, 1), "padding": (1, 1), "ceil_mode": True}, (2, 7, 6)),
         ("max_pool3d", {"kernel_size": 2, "stride": 1, "padding": 1}, (1, 2, 3, 4, 3))]
# window values drawn to tie: zeros of both signs, +-1, +-inf, NaN, 2, and random values
WINDOW_VALUES = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0]


def _window_arrays(shape, np_dtype, seed: int):
    rng = np.random.default_rng(seed)
    base = rng.choice(np.array(WINDOW_VALUES), size=shape, p=[.2, .15, .2, .1, .05, .05, .05, .2])
    base = np.where(rng.random(shape) < 0.3, rng.standard_normal(shape), base)
    return base.astype(np_dtype), rng


def _tensor(a: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16" else torch.from_numpy(a)


def _check_window(name, kw, shape, dtypes=tuple(DTYPES), seed=0) -> None:
    np_mod, th_mod = symgrad.load(name, **kw), symgrad.load(name, backend="torch", **kw)
    for dtype in dtypes:
        what = f"{name} {kw} {dtype}"
        a, rng = _window_arrays(shape, DTYPES[dtype][1], seed)
        y_np, s_np = np_mod.forward(a)
        y_th, s_th = th_mod.forward(_tensor(a, dtype))
        if kw.get("return_indices"):  # (output, PyTorch's indices)
            (y_np, i_np), (y_th, i_th) = y_np, y_th
            assert i_th.dtype == torch.int64 and np.array_equal(i_th.numpy(), i_np), f"{what} indices"
        _same(y_th, y_np, f"{what} forward")
        if "index" in s_np._fields:  # the same Saved: one uint8 window-local index per output
            assert s_th.index.dtype == torch.uint8 and np.array_equal(s_th.index.numpy(), s_np.index), what
        g = rng.standard_normal(y_np.shape)
        g.ravel()[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0][:g.size]
        g = g.astype(a.dtype)
        with np.errstate(invalid="ignore"):
            want = np_mod.backward(g, s_np)[0]
        _same(th_mod.backward(_tensor(g, dtype), s_th)[0], want, f"{what} backward")
        t = rng.standard_normal(shape).astype(a.dtype)
        t.ravel()[:3] = [-0.0, np.inf, np.nan]
        with np.errstate(invalid="ignore"):
            want = np_mod.jvp(t, s_np)
        _same(th_mod.jvp(_tensor(t, dtype), s_th), want, f"{what} jvp")


def _window_variants(cases):
    for name, params, shape in cases:
        for ties in TIES:
            for nan in NANS:
                try:
                    symgrad.ops.resolve(name, ties=ties, nan=nan, **params)
                except ValueError:  # a NaN rule the policy does not take
                    continue
                yield name, dict(params, ties=ties, nan=nan), shape
        for preset in ("torch", "jax"):
            yield name, dict(params, convention=preset), shape


def _window_id(name, kw, shape):
    return f"{name}-{'-'.join(f'{k}{v}' for k, v in kw.items())}".replace(" ", "")


REPRESENTATIVE_WINDOWS = [
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "first"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "last", "nan": "keep"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "split"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "split", "nan": "each"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "all", "nan": "zero"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "convention": "torch"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "convention": "jax"}, (2, 3, 7, 6)),
    ("max_pool2d", {"kernel_size": 2, "ties": "first", "nan": "replace"}, (2, 6, 6)),
    ("max_pool2d", {"kernel_size": 2, "ties": "split"}, (2, 3, 7, 5)),  # tiles, a row and a column in none
    ("max_pool1d", {"kernel_size": 4, "stride": 1, "padding": 2, "dilation": 2, "ceil_mode": True,
                    "ties": "split"}, (2, 2, 11)),
    ("max_pool3d", {"kernel_size": 2, "stride": 1, "padding": 1, "ties": "last", "nan": "last_nan"}, (1, 2, 3, 4, 3)),
    # maxout (windows "blocks"): its torch preset writes grad_output itself (a -0 stays -0), its jax
    # preset starts each gradient from -0
    ("maxout", {"pieces": 2, "convention": "torch"}, (3, 6, 5)),
    ("maxout", {"pieces": 3, "convention": "jax"}, (2, 6)),
    ("maxout", {"pieces": 4, "ties": "split", "nan": "zero"}, (2, 8, 2, 3)),
]
MAXOUTS = [("maxout", {"pieces": 2}, (3, 6, 5)), ("maxout", {"pieces": 3}, (2, 6)),
           ("maxout", {"pieces": 4}, (2, 8, 2, 3))]


@pytest.mark.parametrize("name,kw,shape", REPRESENTATIVE_WINDOWS, ids=[_window_id(*c) for c in REPRESENTATIVE_WINDOWS])
def test_window_module_equals_numpy_module_bit_for_bit(name, kw, shape):
    _check_window(name, kw, shape)


@pytest.mark.slow
@pytest.mark.parametrize("name,kw,shape", list(_window_variants(POOLS + MAXOUTS)),
                         ids=[_window_id(*c) for c in _window_variants(POOLS + MAXOUTS)])
def test_window_module_equals_numpy_module_every_variant(name, kw, shape):
    _check_window(name, kw, shape)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_torch_preset_pooling_equals_torchs_max_pool(dtype):
    """Under the torch preset the module's forward and backward are F.max_pool2d's and its autograd
    backward, bit for bit, with ties and +-inf (no NaN: PyTorch's CPU kernel)."""
    mod = symgrad.load("max_pool2d", backend="torch", kernel_size=3, stride=2, padding=1, convention="torch")
    a, _ = _window_arrays((2, 3, 9, 8), np.float64, 3)
    x = torch.from_numpy(np.where(np.isnan(a), 0.5, a)).to(DTYPES[dtype][0])
    leaf = x.clone().requires_grad_(True)
    want = torch.nn.functional.max_pool2d(leaf, 3, 2, 1)
    g = torch.linspace(-3, 3, want.numel(), dtype=torch.float64).reshape(want.shape).to(x.dtype)
    (want_grad,) = torch.autograd.grad(want, leaf, g)
    got, saved = mod.forward(x)
    _same(got, _to_numpy(want.detach(), None), f"{dtype} forward")
    _same(mod.backward(g, saved)[0], _to_numpy(want_grad, None), f"{dtype} backward")


def _code_only(src: str) -> str:
    """The module's code without comments and strings (docstrings name the frameworks' kernels)."""
    import io
    import tokenize
    return " ".join(t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                    if t.type not in (tokenize.COMMENT, tokenize.STRING))


def test_window_module_is_plain_torch_code():
    """No NumPy, no host round trip, no .item(), no scatter or index_put in a pooling, maxout or
    reduction module."""
    for name, kw, _ in REPRESENTATIVE_WINDOWS + REPRESENTATIVE_REDUCTIONS:
        ((_, src),) = symgrad.pipeline.render(symgrad.ops.resolve(name, **kw), backends.get("torch")).items()
        assert "import torch" in src
        src = _code_only(src).replace(" . ", ".").replace(" (", "(").replace("( )", "()")
        for bad in ("import numpy", "np.nd", ".numpy(", ".item()", ".tolist()", ".cpu()", ".scatter", "scatter_", "index_put",
                    "index_add", "put_(", "import symgrad"):
            assert bad not in src, (name, kw, bad)


def test_window_module_refuses_a_wrong_saved_and_input():
    mod = symgrad.load("max_pool2d", backend="torch", kernel_size=2, ties="first")
    y, saved = mod.forward(torch.zeros(1, 1, 4, 4))
    with pytest.raises(TypeError, match="saved.index must be a tensor of torch.uint8"):
        mod.backward(torch.ones(1, 1, 2, 2), saved._replace(index=saved.index.long()))
    with pytest.raises(ValueError, match="grad_output must have the shape"):
        mod.backward(torch.ones(1, 1, 3, 2), saved)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        mod.forward(np.zeros((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="x must have 3 dims"):
        mod.forward(torch.zeros(4, 4))


@pytest.mark.parametrize("kw", [{"kernel_size": 3, "stride": 2, "padding": 1, "convention": "jax"},
                                {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "last"},
                                {"kernel_size": 2, "stride": 1, "padding": 1, "dilation": 2, "convention": "torch"}])
def test_window_module_returns_the_numpy_modules_indices(kw):
    """return_indices=True: (output, indices), the indices by integer arithmetic from saved.index,
    equal to the NumPy module's (-1 where padding that takes part wins: -inf windows, jax)."""
    np_mod = symgrad.load("max_pool2d", return_indices=True, **kw)
    th_mod = symgrad.load("max_pool2d", return_indices=True, backend="torch", **kw)
    a = np.random.default_rng(0).choice([-np.inf, 0.0, 1.0, 2.0], size=(2, 3, 7, 6))
    (y_np, i_np), _ = np_mod.forward(a)
    (y_th, i_th), _ = th_mod.forward(torch.from_numpy(a))
    _same(y_th, y_np, "output")
    assert i_th.dtype == torch.int64 and np.array_equal(i_th.numpy(), i_np)


# the reductions (windows "rows"): amax and amin over one dim, several dims with keepdim, every
# dim; max and min (no parameters); amax and amin under the torch preset add their jvp by at::sum
# (test_torch_preset_reduction_jvp_is_pytorchs below)
REDUCTIONS = [("amax", {"dim": -1}, (3, 4, 5)), ("amin", {"dim": (0, 2), "keepdim": True}, (3, 4, 5)),
              ("amax", {}, (3, 4, 5)), ("max", {}, (7, 6)), ("min", {}, (5,))]
# tangents with ties of +-0, +-inf and numbers whose sums are exact (NaN in grad_output)
ROW_TANGENTS = np.array([1.0, -1.0, 0.0, -0.0, 3.0, 0.5, np.inf, -np.inf, 0.25, -2.0])


def _reduction_inputs(shape, rng):
    return [rng.choice(np.array(WINDOW_VALUES), shape),
            rng.integers(-1, 2, shape).astype(np.float64) * rng.choice([1.0, -0.0], shape),
            rng.standard_normal(shape)]


def _zeros_as_plus(a: np.ndarray) -> np.ndarray:
    return np.where(a == 0, np.zeros((), a.dtype), a)


def _check_reduction(name, kw, shape, seed=0) -> None:
    """The torch module's forward, Saved, backward and jvp against the NumPy module's, bit for bit,
    except the sign of a zero output of a split/all row holding +0 and -0 (np.max's follows its
    SIMD lanes: the module's docstring)."""
    np_mod, th_mod = symgrad.load(name, **kw), symgrad.load(name, backend="torch", **kw)
    rng = np.random.default_rng(seed)
    for dtype in DTYPES:
        for x in _reduction_inputs(shape, rng):
            what = f"{name} {kw} {dtype}"
            a = x.astype(DTYPES[dtype][1])
            with np.errstate(all="ignore"):
                y_np, s_np = np_mod.forward(a)
                g = rng.choice(ROW_TANGENTS, y_np.shape).astype(a.dtype)
                g.ravel()[:1] = np.nan
                t = rng.choice(ROW_TANGENTS, a.shape).astype(a.dtype)
                want = [np_mod.backward(g, s_np)[0], np_mod.jvp(t, s_np)]
            y_th, s_th = th_mod.forward(_tensor(a, dtype))
            if "index" in s_np._fields:  # the same Saved: the index of each row's winner
                assert str(s_th.index.dtype) == f"torch.{s_np.index.dtype}", what
                assert np.array_equal(s_th.index.to(torch.int64).numpy(), s_np.index.astype(np.int64)), what
                _same(y_th, y_np, f"{what} forward")
            else:
                _same(y_th.clone().masked_fill_(y_th == 0, 0.0), _zeros_as_plus(y_np), f"{what} forward")
                assert s_th.x is not None and tuple(s_th.output.shape) == s_np.output.shape, what
            _same(th_mod.backward(_tensor(g, dtype), s_th)[0], want[0], f"{what} backward")
            got = th_mod.jvp(_tensor(t, dtype), s_th)
            if "index" in s_np._fields or dtype == "float64" or kw.get("convention") == "torch":
                _same(got, want[1], f"{what} jvp")
            else:  # a split row's inexact terms t / count: torch.cumsum adds in float64 (the docstring)
                _close_sum(got, want[1], f"{what} jvp")


def _close_sum(t: torch.Tensor, a: np.ndarray, what: str) -> None:
    """t equals a bit for bit, except finite sums within 2**-22 of a (relative): a float32 sum of
    a few terms added in float64 and rounded once, against NumPy's sequential float32 sum."""
    got, a = _to_numpy(t, None).astype(np.float64), np.asarray(a).astype(np.float64)
    differ = _bits(got) != _bits(a)
    with np.errstate(invalid="ignore"):  # inf - inf
        near = np.isfinite(a) & (a != 0) & (np.abs(got - a) <= 2.0**-22 * np.abs(a))
    assert np.all(near[differ]), what


def _reduction_variants():
    for name, params, shape in REDUCTIONS:
        yield from _window_variants([(name, params, shape)])


REPRESENTATIVE_REDUCTIONS = [
    ("amax", {"dim": -1, "ties": "first"}, (3, 4, 5)),
    ("amax", {"dim": -1, "ties": "last"}, (3, 4, 5)),
    ("amin", {"dim": (0, 2), "keepdim": True, "ties": "split"}, (3, 4, 5)),
    ("amax", {"dim": -1, "ties": "all", "nan": "zero"}, (3, 4, 5)),
    ("amax", {"dim": -1, "convention": "jax"}, (3, 4, 5)),
    ("amin", {"dim": (0, 2), "keepdim": True, "convention": "torch"}, (3, 4, 5)),
    ("max", {"convention": "torch"}, (7, 6)),
    ("min", {"ties": "split", "nan": "each"}, (5,)),
    ("min", {"ties": "split", "nan": "nan"}, (5,)),
]


@pytest.mark.parametrize("name,kw,shape", REPRESENTATIVE_REDUCTIONS,
                         ids=[_window_id(*c) for c in REPRESENTATIVE_REDUCTIONS])
def test_reduction_module_equals_numpy_module_bit_for_bit(name, kw, shape):
    _check_reduction(name, kw, shape)


@pytest.mark.slow
@pytest.mark.parametrize("name,kw,shape", list(_reduction_variants()),
                         ids=[_window_id(*c) for c in _reduction_variants()])
def test_reduction_module_equals_numpy_module_every_variant(name, kw, shape):
    _check_reduction(name, kw, shape)


# the torch preset's jvp of amax/amin: at::sum's order shows in inexact tangents along rows long
# enough for its vector lanes and cascades (contiguous rows, strided columns, several adjacent dims,
# every dim, non-adjacent dims: the NumPy module's row order)
AT_SUM_CASES = [pytest.param(*c, marks=[pytest.mark.slow] if slow else [], id=_window_id(*c)) for c, slow in [
    (("amin", {"dim": 0}, (70, 9)), False), (("amax", {"dim": (1, 2)}, (2, 9, 40)), False),
    (("amax", {"dim": -1}, (3, 100)), True), (("amax", {}, (6, 50)), True),
    (("amin", {"dim": (0, 2), "keepdim": True}, (5, 3, 7)), True)]]


@pytest.mark.parametrize("name,kw,shape", AT_SUM_CASES)
def test_torch_preset_reduction_jvp_is_pytorchs(name, kw, shape):
    """The torch module's jvp under the torch preset equals the NumPy module's (which reproduces
    at::sum's order), float16/32/64 and bfloat16, and, where the reduced dims are adjacent, PyTorch's
    own forward-mode AD of torch.amax/amin in float32/64, bit for bit, on tie-heavy inputs (a few values,
    so rows hold many hits) with inexact tangents; one thread (at::sum's order is that of one)."""
    np_mod = symgrad.load(name, convention="torch", **kw)
    th_mod = symgrad.load(name, backend="torch", convention="torch", **kw)
    rng = np.random.default_rng(7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for dtype in DTYPES:
            a = rng.choice([0.0, -0.0, 1.0, 2.0, 2.0, np.inf, -np.inf], shape).astype(DTYPES[dtype][1])
            t = (rng.standard_normal(shape) * 3).astype(DTYPES[dtype][1])
            with np.errstate(all="ignore"):
                want = np_mod.jvp(t, np_mod.forward(a)[1])
            got = th_mod.jvp(_tensor(t, dtype), th_mod.forward(_tensor(a, dtype))[1])
            _same(got, want, f"{name} {kw} {dtype} jvp")
            if kw.get("dim") == (0, 2) or dtype in ("float16", "bfloat16"):
                # (not adjacent: PyTorch's order differs, the NumPy module's is row order; half
                # types: PyTorch's forward-mode AD rounds t * mask and the quotient in the dtype,
                # the NumPy module computes in float32 and rounds once, seen to differ in the last bit)
                continue
            dims = kw.get("dim", tuple(range(len(shape))))
            own = getattr(torch, name)
            _, theirs = torch.func.jvp(lambda x: own(x, dim=dims, keepdim=kw.get("keepdim", False)),
                                       (_tensor(a, dtype),), (_tensor(t, dtype),))
            _same(theirs, want, f"{name} {kw} {dtype} PyTorch's jvp")
    finally:
        torch.set_num_threads(threads)

