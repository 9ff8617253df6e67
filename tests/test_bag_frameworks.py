"""embedding_bag_max and the segments' pyg preset in the torch and jax backends (issue 33, items
3-4): their modules against the NumPy module (itself checked against the definition and PyTorch in
test_bag.py, against torch_scatter's rule in test_segment_pyg.py) bit for bit, forward, backward
and jvp, float16/32/64 and bfloat16, every policy and preset, on tie-heavy inputs with NaN, +-inf,
+-0, empty bags and segments, padding_idx and include_last_offset; the torch preset against
F.embedding_bag itself; symgrad.torch's EmbeddingBag and symgrad.jax's op taking the native path
(torch.compile(fullgraph=True), jit, vmap, grad)."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from conftest import examples
from test_bag import VALUES, _case, _same_bits

OP = "embedding_bag_max"
_slow = pytest.mark.slow
# the dtypes compared: every one in a slow run, the two rounded apart from NumPy's float code
# (float16 in float16, bfloat16 through float32) in the default run
DTYPES = ("float16", "float32", "float64", "bfloat16") if examples(0, 1) else ("float16", "bfloat16")


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def _bits(a: np.ndarray) -> np.ndarray:
    """An array's values with bfloat16 as float32 (exact), for _same_bits."""
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def _cases(dtype: np.dtype, padding_idx, include_last_offset: bool, count: int = examples(2, 4), length=None):
    """Tie-heavy (rows, weight, offsets, g, t): NaN, +-inf, +-0, repeats, empty bags (length: the
    index list's, random where None)."""
    rng = np.random.default_rng(23)
    for seed in range(count):
        rows, weight, offsets = _case(rng, np.float64, length=int(rng.integers(0, 14)) if length is None else length)
        offsets = np.minimum(offsets, rows.size)
        if include_last_offset:
            offsets[-1] = rows.size
        bags = offsets.size - include_last_offset
        g = rng.choice(VALUES + [0.5, 3.0, -2.5], size=(bags, weight.shape[1]))
        t = rng.choice([0.5, -1.0, 3.0, -0.0, np.inf], size=weight.shape)
        yield seed, rows, weight.astype(dtype), offsets, g.astype(dtype), t.astype(dtype)


# the torch backend ----------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def _to_torch(a):
    if a is None:
        return None
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _from_torch(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_numpy_dtype("bfloat16"))
    return t.numpy()


def _three(fw):
    """(output, grad_weight, jvp) of a module for (rows, weight, offsets, g, t)."""
    def run(rows, weight, offsets, g, t):
        out, saved = fw.forward(rows, weight, offsets)
        return out, fw.backward(g, saved)[1], fw.jvp(None, t, None, saved)
    return run


def _compare(framework, to, back, settings: dict, padding_idx=None, include_last_offset=False, dtypes=DTYPES,
             calls=_three, length=None):
    """The framework module against the NumPy module, forward, backward and jvp, bit for bit
    (calls: the module's (output, grad_weight, jvp) as run, e.g. jitted)."""
    params = dict(padding_idx=padding_idx, include_last_offset=include_last_offset)
    mod = symgrad.load(OP, **settings, **params)
    run = calls(symgrad.load(OP, backend=framework, **settings, **params))
    for name in dtypes:
        dtype = _numpy_dtype(name)
        for seed, rows, weight, offsets, g, t in _cases(dtype, padding_idx, include_last_offset, length=length):
            what = f"{settings} {params} {name} case {seed}"
            out, saved = mod.forward(rows, weight, offsets)
            got = run(*(to(a) for a in (rows, weight, offsets, g, t)))
            want = (out, mod.backward(g, saved)[1], mod.jvp(None, t, None, saved))
            for part, a, b in zip(("output", "grad_weight", "jvp"), got, want):
                _same_bits(_bits(back(a)), _bits(b), f"{part} {what}")


SETTINGS = [pytest.param({"ties": "first"}, None, False, marks=_slow),
            pytest.param({"convention": "torch"}, 2, True, marks=_slow), ({"ties": "split"}, -1, False),
            pytest.param({"convention": "jax"}, None, True, marks=_slow),
            pytest.param({"ties": "last"}, 1, False, marks=_slow),
            pytest.param({"ties": "all"}, None, False, marks=_slow),
            pytest.param({"ties": "first", "nan": "keep"}, None, False, marks=_slow),
            pytest.param({"ties": "last", "nan": "keep"}, 0, True, marks=_slow),
            pytest.param({"ties": "split", "nan": "zero"}, None, False, marks=_slow),
            pytest.param({"ties": "split", "nan": "nan"}, None, False, marks=_slow),
            pytest.param({"ties": "split", "nan": "each"}, 2, False, marks=_slow),
            pytest.param({"ties": "all", "nan": "zero"}, None, True, marks=_slow)]


@pytest.mark.parametrize("settings,padding_idx,include_last_offset", SETTINGS)
def test_torch_module_is_the_numpy_modules_bit_for_bit(settings, padding_idx, include_last_offset):
    _compare("torch", _to_torch, _from_torch, settings, padding_idx, include_last_offset)


def test_torch_module_2d_input_and_preset_against_pytorch():
    """A 2-d input (a bag per row) through the torch module under the torch preset equals
    F.embedding_bag itself."""
    fw = symgrad.load(OP, backend="torch", convention="torch")
    rng = np.random.default_rng(3)
    weight = torch.tensor(np.array(rng.choice(VALUES, size=(5, 4)), dtype=np.float32))
    rows = torch.tensor(rng.integers(0, 5, size=(6, 3)))
    g = torch.tensor(rng.normal(size=(6, 4)), dtype=torch.float32)
    w = weight.clone().requires_grad_(True)
    want = torch.nn.functional.embedding_bag(rows, w, mode="max")
    want.backward(g)
    out, saved = fw.forward(rows, weight, None)
    _same_bits(out.numpy(), want.detach().numpy(), "output")
    _same_bits(fw.backward(g, saved)[1].numpy(), w.grad.numpy(), "grad_weight")



@pytest.mark.parametrize("dtype,include_last_offset,padding_idx", [(np.float32, True, 2),
                                                                   pytest.param(np.float64, False, -1, marks=_slow)])
def test_torch_module_preset_against_pytorch_with_offsets(dtype, include_last_offset, padding_idx):
    """The torch preset's module equals F.embedding_bag(mode="max") itself on 1-d inputs with
    offsets (empty bags, padding_idx, include_last_offset), output and the table's gradient."""
    from test_bag import _torch as pytorch_bag
    fw = symgrad.load(OP, backend="torch", convention="torch", include_last_offset=include_last_offset,
                      padding_idx=padding_idx)
    for seed, rows, weight, offsets, g, _ in _cases(np.dtype(dtype), padding_idx, include_last_offset):
        want_out, want_grad = pytorch_bag(rows, weight, offsets, g, include_last_offset=include_last_offset,
                                          padding_idx=padding_idx)
        out, saved = fw.forward(torch.tensor(rows), torch.tensor(weight), torch.tensor(offsets))
        _same_bits(out.numpy(), want_out, f"output case {seed}")
        _same_bits(fw.backward(torch.tensor(g), saved)[1].numpy(), want_grad, f"grad_weight case {seed}")


def test_torch_module_bad_input_is_one_line():
    fw = symgrad.load(OP, backend="torch")
    weight = torch.zeros((3, 2))
    for rows, offsets, match in (([0, 1], [1], "offsets must be non-decreasing from 0"),
                                 ([0, 3], [0], r"table rows in \[0, 3\)"),
                                 ([[0, 1]], [0], "2-d input with offsets None")):
        with pytest.raises(ValueError, match=match):
            fw.forward(torch.tensor(rows), weight, torch.tensor(offsets))
    with pytest.raises(TypeError, match="integers"):
        fw.forward(torch.tensor([0.0]), weight, torch.tensor([0]))


@_slow  # (torch.compile's first compile: about 15 s on the loaded 2-core machine)
def test_symgrad_torch_embedding_bag_compiles_natively():
    """EmbeddingBag under torch.compile(fullgraph=True) from the first call runs the torch
    backend's module (no registered operator in the graph) with the eager bits."""
    import symgrad.torch as st
    rng = np.random.default_rng(29)
    rows, weight, offsets = _case(rng, np.float32, nan=False)
    bag = st.EmbeddingBag(*weight.shape, _weight=torch.tensor(weight), ties="split", padding_idx=1)
    assert bag.fn._native is not None
    y = bag(torch.tensor(rows), torch.tensor(offsets))
    y.sum().backward()
    want = bag.weight.grad.clone()
    bag.weight.grad = None
    seen = []
    compiled = torch.compile(bag, fullgraph=True, backend=lambda gm, _: seen.append(gm) or gm.forward)
    z = compiled(torch.tensor(rows), torch.tensor(offsets))
    z.sum().backward()
    assert not any("symgrad." in str(n.target) for gm in seen for n in gm.graph.nodes)
    _same_bits(z.detach().numpy(), y.detach().numpy(), "compiled output")
    _same_bits(bag.weight.grad.numpy(), want.numpy(), "compiled grad")


# the jax backend ------------------------------------------------------------------------------

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


def _to_jax(a):
    return None if a is None else jnp.asarray(a)


def _from_jax(a):
    return np.asarray(a)


def _jitted(fw):
    return jax.jit(_three(fw))  # (one compile a dtype)


def test_jax_module_is_the_numpy_modules_bit_for_bit():
    """The default run's case: first with padding_idx, float32, jitted (one compile: 1.7 s at load
    average 10 on 2 cores, split's mask 3.0 s); every setting and dtype in the slow test below."""
    _compare("jax", _to_jax, _from_jax, {"ties": "first"}, -1, False, dtypes=("float32",), calls=_jitted,
             length=12)


@_slow  # (each setting jitted once per dtype, an index list of one length: about 8 s a setting)
@pytest.mark.parametrize("settings,padding_idx,include_last_offset",
                         [p.values if hasattr(p, "values") else p for p in SETTINGS])
def test_jax_module_every_setting_and_dtype(settings, padding_idx, include_last_offset):
    _compare("jax", _to_jax, _from_jax, settings, padding_idx, include_last_offset, calls=_jitted, length=12)


@pytest.mark.parametrize("include_last_offset,left_out", [(False, False), pytest.param(True, True, marks=_slow)])
def test_symgrad_jax_op_takes_a_2d_input_without_offsets_as_pytorch(include_last_offset, left_out):
    """symgrad.jax.op('embedding_bag_max', convention='torch') with offsets None (or left out) and a
    2-d input (each row a bag) equals F.embedding_bag(input, weight, mode='max') itself: output and
    the table's gradient, bit for bit, under jit; offsets None with a 1-d input: one clear error."""
    import symgrad.jax as sj
    fn = sj.op(OP, convention="torch", include_last_offset=include_last_offset)
    rng = np.random.default_rng(5)
    weight = np.array(rng.choice(VALUES, size=(5, 4)), dtype=np.float32)
    rows, g = rng.integers(0, 5, size=(6, 3)), np.array(rng.normal(size=(6, 4)), dtype=np.float32)
    w = torch.tensor(weight, requires_grad=True)
    want = torch.nn.functional.embedding_bag(torch.tensor(rows), w, mode="max",
                                             include_last_offset=include_last_offset)
    want.backward(torch.tensor(g))
    call = (lambda w: fn(rows, w)) if left_out else (lambda w: fn(rows, w, None))
    out, vjp = jax.vjp(jax.jit(call), jnp.asarray(weight))
    _same_bits(np.asarray(out), want.detach().numpy(), "output")
    _same_bits(np.asarray(vjp(jnp.asarray(g))[0]), w.grad.numpy(), "grad_weight")
    with pytest.raises(ValueError, match="offsets None needs a 2-d input"):
        fn(rows[0], weight, None)


@_slow
def test_symgrad_jax_op_runs_the_module_natively():
    """symgrad.jax.op('embedding_bag_max') is the jax backend's module (no callback): under jit,
    its grad is the NumPy module's backward bit for bit, vmap over tables gives each table's
    output, and jvp its jvp."""
    import symgrad.jax as sj
    fn = sj.op(OP, ties="first", padding_idx=2)
    assert "native" in repr(fn)
    mod = symgrad.load(OP, ties="first", padding_idx=2)
    (_, rows, weight, offsets, g, t), = _cases(np.dtype(np.float64), 2, False, count=1, length=12)
    out, saved = mod.forward(rows, weight, offsets)
    y, vjp = jax.vjp(jax.jit(lambda w: fn(rows, w, offsets)), jnp.asarray(weight))
    _same_bits(np.asarray(y), out, "output")
    _same_bits(np.asarray(vjp(jnp.asarray(g))[0]), mod.backward(g, saved)[1], "grad")
    _, y_dot = jax.jvp(lambda w: fn(rows, w, offsets), (jnp.asarray(weight),), (jnp.asarray(t),))
    _same_bits(np.asarray(y_dot), mod.jvp(None, t, None, saved), "jvp")
    tables = np.stack([weight, weight[::-1]])
    batched = jax.jit(jax.vmap(lambda w: fn(rows, w, offsets)))(jnp.asarray(tables))
    for k in range(2):
        _same_bits(np.asarray(batched[k]), mod.forward(rows, tables[k], offsets)[0], f"vmap {k}")



# the pyg preset of the segments (torch_scatter's CPU rule) ------------------------------------

def _pyg_cases(op: str, dtype, count: int = examples(3, 6)):
    """(inputs after src, src, g, t) of segment_max/min (ids into 6 segments) or their csr form
    (indptr of 6 segments), on test_segment_pyg's tie-heavy rows with NaN, +-inf, +-0 and the start."""
    from test_segment_pyg import _pyg_inputs
    rng = np.random.default_rng(31)
    ext = "min" if "min" in op else "max"
    for _ in range(count):
        src = _pyg_inputs(rng, dtype, ext)
        if op.endswith("csr"):
            index = np.sort(rng.integers(0, 13, 7))
            index[0], index[-1] = 0, 12
        else:
            index = rng.integers(0, 6, 12)
        g = np.array(rng.choice([1.0, -3.0, 0.5, -0.0], (6, 2)), dtype=dtype)
        yield src, index, g, np.array(rng.choice([2.0, -1.0, np.inf], src.shape), dtype=dtype)


def _compare_pyg(framework, to, back, op, dtypes, jit=lambda f: f):
    params = {} if op.endswith("csr") else {"num_segments": 6}
    mod = symgrad.load(op, convention="pyg", **params)
    fw = symgrad.load(op, backend=framework, convention="pyg", **params)

    def run(src, index, g, t):
        out, saved = fw.forward(src, index)
        return out, fw.backward(g, saved)[0], fw.jvp(t, None, saved)
    run = jit(run)
    for dtype in dtypes:
        for k, (src, index, g, t) in enumerate(_pyg_cases(op, dtype)):
            out, saved = mod.forward(src, index)
            want = (out, mod.backward(g, saved)[0], mod.jvp(t, None, saved))
            got = run(*(to(a) for a in (src, index, g, t)))
            for part, a, b in zip(("output", "grad_src", "jvp"), got, want):
                _same_bits(back(a), b, f"{op} {framework} {part} {np.dtype(dtype)} case {k}")


@pytest.mark.parametrize("op", ["segment_min_csr", pytest.param("segment_max", marks=_slow),
                                pytest.param("segment_min", marks=_slow), pytest.param("segment_max_csr", marks=_slow)])
def test_torch_pyg_preset_is_the_numpy_modules_bit_for_bit(op):
    _compare_pyg("torch", _to_torch, _from_torch, op, (np.float32, np.float64))


@_slow  # (jitted: about 3 s an op at load 12 on 2 cores)
@pytest.mark.parametrize("op", ["segment_max_csr", "segment_max", "segment_min", "segment_min_csr"])
def test_jax_pyg_preset_is_the_numpy_modules_bit_for_bit(op):
    _compare_pyg("jax", _to_jax, _from_jax, op, (np.float32, np.float64), jit=jax.jit)


@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=_slow)])
def test_framework_pyg_preset_refuses_half_precision_in_one_line(framework):
    lib = torch if framework == "torch" else jnp
    fw = symgrad.load("segment_max_csr", backend=framework, convention="pyg")
    with pytest.raises(TypeError, match="float32 or float64") as err:
        fw.forward(lib.zeros(2, dtype=lib.float16), lib.asarray(np.array([0, 2])))
    assert "\n" not in str(err.value)


# roi_max_pool (bins of boxes: the same modules, each bin an H x W grid of candidates) ----------

def _roi_cases(dtype, size, count: int = examples(2, 4)):
    """test_roi's tie-heavy inputs (NaN, +-inf, +-0, -FLT_MAX) and boxes (overlapping, empty and
    outside bins), with g and t."""
    from test_roi import _case as roi_case
    rng = np.random.default_rng(37)
    for k in range(count):
        x, boxes = roi_case(rng, np.float64)
        g = rng.choice([1.0, -2.5, 0.5, 3.0, -0.0], size=(boxes.shape[0], x.shape[1]) + size)
        t = rng.choice([1.0, -2.5, 0.5, -0.0], size=x.shape)
        with np.errstate(over="ignore"):  # (-FLT_MAX is -inf in float16)
            yield k, x.astype(dtype), boxes.astype(dtype), g.astype(dtype), t.astype(dtype)


def _compare_roi(framework, to, back, settings: dict, size=(2, 3), scale=0.5, dtypes=DTYPES, jit=lambda f: f):
    params = dict(output_size=size, spatial_scale=scale)
    mod = symgrad.load("roi_max_pool", **settings, **params)
    fw = symgrad.load("roi_max_pool", backend=framework, **settings, **params)

    def run(x, boxes, g, t):
        out, saved = fw.forward(x, boxes)
        return out, fw.backward(g, saved)[0], fw.jvp(t, None, saved)
    run = jit(run)
    for name in dtypes:
        for k, x, boxes, g, t in _roi_cases(_numpy_dtype(name), size):
            with np.errstate(over="ignore"):  # (the NumPy module's float16 check of the boxes)
                out, saved = mod.forward(x, boxes)
            want = (out, mod.backward(g, saved)[0], mod.jvp(t, None, saved))
            got = run(*(to(a) for a in (x, boxes, g, t)))
            for part, a, b in zip(("output", "grad_input", "jvp"), got, want):
                _same_bits(_bits(back(a)), _bits(b), f"roi {framework} {settings} {part} {name} case {k}")


ROI_SETTINGS = [{"convention": "torch"}, pytest.param({"ties": "split"}, marks=_slow),
                pytest.param({"ties": "first"}, marks=_slow), pytest.param({"ties": "last", "nan": "keep"}, marks=_slow),
                pytest.param({"ties": "all", "nan": "zero"}, marks=_slow),
                pytest.param({"ties": "split", "nan": "nan"}, marks=_slow)]


@pytest.mark.parametrize("settings", ROI_SETTINGS)
def test_torch_roi_module_is_the_numpy_modules_bit_for_bit(settings):
    _compare_roi("torch", _to_torch, _from_torch, settings)


@_slow  # (jitted once per dtype: about 3 s a setting at load 12 on 2 cores)
@pytest.mark.parametrize("settings", [{"ties": "first"}, {"ties": "split"}, {"ties": "last", "nan": "keep"},
                                      {"ties": "all", "nan": "zero"}])
def test_jax_roi_module_is_the_numpy_modules_bit_for_bit(settings):
    _compare_roi("jax", _to_jax, _from_jax, settings, jit=jax.jit)


@_slow  # (torch.compile's first compile: about 15 s on the loaded 2-core machine)
def test_symgrad_torch_roipool_compiles_natively():
    """RoIPool under torch.compile(fullgraph=True) from the first call runs the torch backend's
    module (no registered operator in the graph), with torchvision's bits (the torch preset)."""
    import symgrad.torch as st
    from test_roi import _case as roi_case
    from test_roi import _torchvision
    x, boxes = roi_case(np.random.default_rng(41), np.float32)
    g = np.ones((boxes.shape[0], x.shape[1], 2, 2), np.float32)
    want_out, want_grad = _torchvision(x, boxes, (2, 2), 0.5, g)
    pool = st.RoIPool(2, 0.5, convention="torch")
    assert pool.fn._native is not None
    seen = []
    compiled = torch.compile(pool, fullgraph=True, backend=lambda gm, _: seen.append(gm) or gm.forward)
    xt = torch.tensor(x, requires_grad=True)
    y = compiled(xt, torch.tensor(boxes))
    y.backward(torch.tensor(g))
    assert seen and not any("symgrad." in str(n.target) for gm in seen for n in gm.graph.nodes)
    _same_bits(y.detach().numpy(), want_out, "compiled output")
    _same_bits(xt.grad.numpy(), want_grad, "compiled grad")


@_slow
def test_symgrad_jax_roi_op_runs_natively():
    import symgrad.jax as sj
    fn = sj.op("roi_max_pool", ties="split", output_size=2)
    assert "native" in repr(fn)
    (_, x, boxes, g, _), = _roi_cases(np.dtype(np.float64), (2, 2), count=1)
    mod = symgrad.load("roi_max_pool", ties="split", output_size=2)
    out, saved = mod.forward(x, boxes)
    y, vjp = jax.vjp(jax.jit(lambda a: fn(a, boxes)), jnp.asarray(x))
    _same_bits(np.asarray(y), out, "output")
    _same_bits(np.asarray(vjp(jnp.asarray(g))[0]), mod.backward(g, saved)[0], "grad")
