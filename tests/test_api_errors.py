"""Errors of the Python API and of the generated functions.

* symgrad.load / derive / generate: a wrong type is a TypeError, a wrong value a ValueError, and
  the message names the offending parameter;
* generated forward/backward: bad dtypes, ranks, sizes, dims, grad_output shapes and saved values;
* a zero-size batch is not an error.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import symgrad

# ----------------------------------------------------------------------------- the API

ENTRY_POINTS = ("load", "derive", "generate")


@pytest.fixture(params=ENTRY_POINTS)
def entry(request, tmp_path, monkeypatch):
    """One of the API entry points as f(op, **kwargs); generate writes under tmp_path/out."""
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"

    def call(op, **kwargs):
        if request.param == "generate":
            return symgrad.generate(op, out, **kwargs)
        return getattr(symgrad, request.param)(op, **kwargs)

    yield call
    assert not out.exists(), "a failed generate must write nothing"


# (id, op, keyword arguments, exception, regex the message must match)
API_ERRORS = [
    ("unknown-op", "softmax", {}, ValueError, r"op 'softmax'"),
    ("op-not-a-string", 3, {}, TypeError, r"\bop\b.*string"),
    ("op-none", None, {}, TypeError, r"\bop\b"),
    ("unknown-ties", "relu", {"ties": "random"}, ValueError, r"tie.*'random'"),
    ("ties-int", "relu", {"ties": 3}, TypeError, r"\bties\b"),
    ("kernel_size-0", "max_pool2d", {"kernel_size": 0}, ValueError, r"kernel_size"),
    ("kernel_size-0-in-tuple", "max_pool2d", {"kernel_size": (2, 0)}, ValueError, r"kernel_size"),
    ("stride-0", "max_pool2d", {"kernel_size": 2, "stride": 0}, ValueError, r"\bstride\b"),
    ("dilation-0", "max_pool2d", {"kernel_size": 2, "dilation": 0}, ValueError, r"\bdilation\b"),
    ("padding-negative", "max_pool2d", {"kernel_size": 2, "padding": -1}, ValueError,
     r"\bpadding\b"),
    ("padding-above-half-kernel", "max_pool2d", {"kernel_size": 3, "padding": 2}, ValueError,
     r"\bpadding\b"),
    ("padding-above-half-kernel-1d", "max_pool1d", {"kernel_size": 2, "padding": 2}, ValueError,
     r"\bpadding\b"),
    ("kernel_size-float", "max_pool2d", {"kernel_size": 2.5}, TypeError, r"kernel_size"),
    ("kernel_size-str", "max_pool2d", {"kernel_size": "2"}, TypeError, r"kernel_size"),
    ("kernel_size-bool", "max_pool2d", {"kernel_size": True}, TypeError, r"kernel_size"),
    ("kernel_size-3-values", "max_pool2d", {"kernel_size": (2, 2, 2)}, ValueError, r"kernel_size"),
    ("stride-3-values", "max_pool2d", {"kernel_size": 2, "stride": (1, 1, 1)}, ValueError,
     r"\bstride\b"),
    ("ceil_mode-int", "max_pool2d", {"kernel_size": 2, "ceil_mode": 1}, TypeError, r"ceil_mode"),
    ("negative_slope-str", "leaky_relu", {"negative_slope": "x"}, TypeError, r"negative_slope"),
    ("negative_slope-inf", "leaky_relu", {"negative_slope": float("inf")}, ValueError,
     r"negative_slope"),
    ("clamp-no-bounds", "clamp", {"min": None, "max": None}, ValueError, r"\bmin\b.*\bmax\b"),
    ("clamp-min-str", "clamp", {"min": "0"}, TypeError, r"\bmin\b"),
    ("hardtanh-min-above-max", "hardtanh", {"min_val": 2.0, "max_val": 1.0}, ValueError,
     r"min_val"),
    ("pieces-0", "maxout", {"pieces": 0}, ValueError, r"\bpieces\b"),
    ("pieces-float", "maxout", {"pieces": 2.0}, TypeError, r"\bpieces\b"),
    ("dim-repeated", "amax", {"dim": (1, 1)}, ValueError, r"\bdim\b"),
    ("dim-float", "amax", {"dim": 1.5}, TypeError, r"\bdim\b"),
    ("unexpected-parameter", "relu", {"kernel_size": 2}, TypeError, r"kernel_size"),
    ("unexpected-parameter-typo", "max_pool2d", {"kernel_size": 2, "strides": 2}, TypeError,
     r"strides"),
    ("missing-kernel_size", "max_pool2d", {}, TypeError, r"kernel_size"),
    ("missing-pieces", "maxout", {}, TypeError, r"\bpieces\b"),
    ("convention", "relu", {"convention": "pytorch"}, ValueError, r"convention.*'pytorch'.*torch, jax"),
    ("convention-type", "relu", {"convention": 3}, TypeError, r"convention must be"),
    ("nan-rule", "relu", {"nan": "propagate"}, ValueError, r"NaN rule 'propagate'"),
    ("nan-vs-policy", "relu", {"nan": "zero"}, ValueError, r"NaN rule 'zero' expects tie policy split or all"),
    ("order", "relu", {"order": "backwards"}, ValueError, r"order must be one of given, reversed"),
    ("order-window", "max_pool1d", {"kernel_size": 2, "order": "reversed"}, ValueError, r"order='reversed' applies to elementwise"),
]


@pytest.mark.parametrize("op,kwargs,exc,match", [c[1:] for c in API_ERRORS],
                         ids=[c[0] for c in API_ERRORS])
def test_api_rejects_bad_arguments(entry, op, kwargs, exc, match):
    with pytest.raises(exc, match=match) as info:
        entry(op, **kwargs)
    assert type(info.value) is exc  # not a subclass, e.g. not a KeyError for ValueError


@pytest.mark.parametrize("fn", ["load", "generate"])
def test_unknown_backend(fn, tmp_path, monkeypatch):
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    args = ("relu", tmp_path / "out") if fn == "generate" else ("relu",)
    with pytest.raises(ValueError, match=r"backend.*'opencl'.*numpy, cuda"):
        getattr(symgrad, fn)(*args, backend="opencl")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- generated code

@pytest.fixture
def load(tmp_path, monkeypatch):
    """symgrad.load with the cache in tmp_path (set before the call)."""
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    return symgrad.load


# (id, op, params): modules of every template and both selection forms (scan and mask)
MODULES = [
    ("relu", "relu", {}),
    ("maximum", "maximum", {}),
    ("max_pool2d", "max_pool2d", {"kernel_size": 2}),
    ("max_pool2d-split", "max_pool2d", {"kernel_size": 2, "ties": "split"}),
    ("maxout", "maxout", {"pieces": 2}),
    ("amax", "amax", {"dim": 1}),
    ("amax-split", "amax", {"dim": 1, "ties": "split"}),
]
MODULE_IDS = [m[0] for m in MODULES]
SHAPE = (2, 4, 4, 4)  # valid for every module above

BAD_DTYPES = [np.int64, np.bool_, np.complex128, object]


def _inputs(module, x):
    return [x] * len(getattr(module, "INPUTS", ("x",)))


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op,params", [m[1:] for m in MODULES], ids=MODULE_IDS)
def test_forward_rejects_non_float_dtypes(load, op, params, dtype):
    module = load(op, **params)
    x = np.zeros(SHAPE, dtype=dtype)
    with pytest.raises(TypeError, match=rf"float.*dtype {np.dtype(dtype).name}"):
        module.forward(*_inputs(module, x))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_the_dtype_error_names_every_dtype_forward_takes(load, backend):
    """The TypeError for an integer input lists every floating dtype that forward accepts: it
    left out bfloat16 (ml_dtypes), which forward takes."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    candidates = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.longdouble,
                  ml_dtypes.float8_e4m3fn, np.int8, np.int64, np.complex64]
    for op, params in (("relu", {}), ("max_pool2d", {"kernel_size": 2}), ("maximum", {})):
        module = load(op, backend=backend, **params)
        taken = []
        for dtype in candidates:
            try:
                module.forward(*_inputs(module, np.ones(SHAPE, dtype=dtype)))
                taken.append(np.dtype(dtype).name)
            except TypeError:
                pass
        assert "bfloat16" in taken and "float64" in taken
        with pytest.raises(TypeError) as info:
            module.forward(*_inputs(module, np.ones(SHAPE, dtype=np.int64)))
        named = set(re.findall(r"\b(\w*float\d+)\b", str(info.value)))
        assert named == set(taken), str(info.value)


@pytest.mark.parametrize("op,params", [m[1:] for m in MODULES], ids=MODULE_IDS)
def test_backward_rejects_a_non_float_grad_output(load, op, params):
    module = load(op, **params)
    y, saved = module.forward(*_inputs(module, np.ones(SHAPE)))
    with pytest.raises(TypeError, match=r"grad_output.*dtype int64"):
        module.backward(np.zeros(y.shape, dtype=np.int64), saved)


def test_forward_rejects_an_unconvertible_input(load):
    relu = load("relu")
    with pytest.raises(TypeError, match=r"\bx\b"):
        relu.forward([[1.0], [1.0, 2.0]])  # ragged


@pytest.mark.parametrize("ties", ["first", "split"])
@pytest.mark.parametrize("shape", [(4, 4), (1, 1, 1, 4, 4), (4,)], ids=["rank2", "rank5", "rank1"])
def test_max_pool2d_rejects_wrong_rank(load, shape, ties):
    mp = load("max_pool2d", kernel_size=2, ties=ties)
    with pytest.raises(ValueError, match=r"dims.*" + r"\(" + ", ".join(map(str, shape))):
        mp.forward(np.zeros(shape))


@pytest.mark.parametrize("params,shape", [
    ({"kernel_size": 3}, (1, 1, 1, 1)),
    ({"kernel_size": 2}, (1, 1, 1, 1)),
    ({"kernel_size": (1, 3)}, (1, 2, 5, 2)),  # only the last spatial dim is too small
    ({"kernel_size": 2, "dilation": 3}, (1, 3, 3)),  # the dilated window spans 4
], ids=["k3-1x1", "k2-1x1", "k1x3-5x2", "dilated-3x3"])
def test_max_pool2d_rejects_inputs_too_small_for_one_window(load, params, shape):
    mp = load("max_pool2d", **params)
    with pytest.raises(ValueError, match=r"too small.*kernel_size"):
        mp.forward(np.zeros(shape))


@pytest.mark.parametrize("shape", [(1, 0, 4, 4), (1, 2, 0, 4)], ids=["no-channels", "zero-height"])
def test_max_pool2d_rejects_zero_channel_or_spatial_size(load, shape):
    mp = load("max_pool2d", kernel_size=2)
    with pytest.raises(ValueError, match=r"shape"):
        mp.forward(np.zeros(shape))


@pytest.mark.parametrize("ties", ["first", "split"])
@pytest.mark.parametrize("channels", [3, 5])
def test_maxout_rejects_channels_not_divisible_by_pieces(load, channels, ties):
    mo = load("maxout", pieces=2, ties=ties)
    with pytest.raises(ValueError, match=r"pieces=2"):
        mo.forward(np.zeros((2, channels, 3)))


@pytest.mark.parametrize("ties", ["first", "split"])
@pytest.mark.parametrize("dim,shape", [(1, (4,)), (2, (3, 4)), (-3, (3, 4)), ((0, 2), (3, 4))],
                         ids=["1-of-rank1", "2-of-rank2", "neg3-of-rank2", "0and2-of-rank2"])
def test_amax_rejects_dim_out_of_range(load, dim, shape, ties):
    am = load("amax", dim=dim, ties=ties)
    with pytest.raises(ValueError, match=r"\bdim\b.*out of range"):
        am.forward(np.zeros(shape))


@pytest.mark.parametrize("op,params", [m[1:] for m in MODULES], ids=MODULE_IDS)
def test_backward_rejects_grad_output_of_the_wrong_shape(load, op, params):
    module = load(op, **params)
    y, saved = module.forward(*_inputs(module, np.ones(SHAPE)))
    for bad in (np.ones(y.shape + (1,)), np.ones(y.shape[:-1] + (y.shape[-1] + 1,)), np.ones(())):
        with pytest.raises(ValueError, match=r"grad_output.*shape"):
            module.backward(bad, saved)


# (id, module, module whose Saved is passed instead)
FOREIGN_SAVED = [
    ("relu-gets-max_pool2d", ("relu", {}), ("max_pool2d", {"kernel_size": 2})),
    ("max_pool2d-gets-other-max_pool2d", ("max_pool2d", {"kernel_size": 2}),
     ("max_pool2d", {"kernel_size": 2, "stride": 1})),
    ("max_pool2d-first-gets-split", ("max_pool2d", {"kernel_size": 2}),
     ("max_pool2d", {"kernel_size": 2, "ties": "split"})),
    ("amax-gets-amax-split", ("amax", {"dim": 1}), ("amax", {"dim": 1, "ties": "split"})),
    ("maxout-gets-relu", ("maxout", {"pieces": 2}), ("relu", {})),
]


@pytest.mark.parametrize("mine,other", [c[1:] for c in FOREIGN_SAVED],
                         ids=[c[0] for c in FOREIGN_SAVED])
def test_backward_rejects_the_saved_of_another_module(load, mine, other):
    module, foreign = load(mine[0], **mine[1]), load(other[0], **other[1])
    assert module is not foreign
    x = np.ones(SHAPE)
    y, saved = module.forward(*_inputs(module, x))
    _, foreign_saved = foreign.forward(*_inputs(foreign, x))
    with pytest.raises(TypeError, match=r"\bsaved\b"):
        module.backward(np.ones(y.shape), foreign_saved)
    with pytest.raises(TypeError, match=r"\bsaved\b"):
        module.backward(np.ones(y.shape), None)
    with pytest.raises(TypeError, match=r"\bsaved\b"):
        module.backward(np.ones(y.shape), tuple(saved))  # a plain tuple of the right fields


@pytest.mark.parametrize("ties", ["first", "split", "all"])
@pytest.mark.parametrize("params,out_hw", [
    ({"kernel_size": 2}, (2, 2)),
    ({"kernel_size": 3, "stride": 2, "padding": 1}, (2, 2)),
], ids=["k2", "k3-s2-p1"])
def test_max_pool2d_zero_size_batch(load, params, out_hw, ties):
    mp = load("max_pool2d", ties=ties, **params)
    x = np.zeros((0, 3, 4, 4), dtype=np.float32)
    y, saved = mp.forward(x)
    assert y.shape == (0, 3) + out_hw
    assert y.dtype == np.float32
    (gx,) = mp.backward(np.zeros(y.shape, dtype=np.float32), saved)
    assert gx.shape == x.shape
    assert gx.dtype == np.float32


@pytest.mark.parametrize("ties", ["first", "split"])
def test_maximum_rejects_shapes_that_do_not_broadcast(load, ties):
    mx = load("maximum", ties=ties)
    with pytest.raises(ValueError, match=r"broadcast.*\(2, 3\).*\(4,\)"):
        mx.forward(np.zeros((2, 3)), np.zeros(4))


@pytest.mark.parametrize("ties", ["first", "split"])
def test_amax_rejects_reducing_an_empty_dim(load, ties):
    am = load("amax", dim=1, ties=ties)
    with pytest.raises(ValueError, match=r"size 0"):
        am.forward(np.zeros((2, 0)))


@pytest.mark.parametrize("op, args", [("maximum", 2), ("relu", 1), ("amax", 1)])
def test_more_than_32_dims_is_a_value_error(load, op, args):
    """NumPy's broadcasting stops at 32 dims (its RuntimeError escaped from maximum)."""
    module = load(op, ties="split")
    x = np.ones((1,) * 33)
    with pytest.raises(ValueError, match="must have at most 32 dims, got 33"):
        module.forward(*[x] * args)
    y, saved = module.forward(*[np.ones((1,) * 32)] * args)  # 32 still works
    assert y.ndim in (0, 32)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_an_output_larger_than_memory_is_a_value_error(load, backend):
    """A broadcast view (8 bytes of memory) whose output, gradient or intermediates would take
    8 TB: one ValueError naming the input and the machine's memory, before anything is made (relu
    tried to allocate 7.28 TiB, MemoryError; logsumexp hung); inputs broadcasting to such an
    output, an adaptive output_size, an unpooling whose input fits and output does not; a view that fits is
    computed."""
    import math
    import os
    huge = (10**6, 10**6)
    if 8 * 10**12 <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"):
        pytest.skip("this machine holds 8 TB")
    view = np.broadcast_to(np.ones(1), huge)
    n = math.isqrt(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 16)  # n*n float64 fit, 4*n*n do not
    calls = [("relu", {}, (view,)), ("logsumexp", {"dim": -1}, (view,)), ("amax", {"dim": 0}, (view,)),
             ("max_pool2d", {"kernel_size": 2}, (view[None, None],)),
             ("maximum", {}, (np.ones((10**6, 1)), np.ones((1, 10**6)))), ("maximum", {}, (view, view)),
             ("adaptive_max_pool2d", {"output_size": huge}, (np.ones((1, 1, 2, 2)),)),
             ("max_unpool2d", {"kernel_size": 2}, (np.broadcast_to(np.ones(1), (1, 1, n, n)),
                                                   np.broadcast_to(np.zeros(1, np.int64), (1, 1, n, n))))]
    for op, params, args in calls:
        module = load(op, backend=backend, **params)
        with pytest.raises(ValueError) as info:
            module.forward(*args)
        msg = str(info.value)
        size = 8 * 4 * n * n if op == "max_unpool2d" else 8 * 10**12
        assert "\n" not in msg and "memory" in msg and f"{size} bytes" in msg, (op, msg)
    y, _ = load("relu", backend=backend).forward(np.broadcast_to(np.full(1, -2.0), (1000, 1000)))
    np.testing.assert_array_equal(y, np.zeros((1000, 1000)))


@pytest.mark.parametrize("op", [np.array([2, 2]), np.array(["relu", "amax"]), 3, None])
def test_an_op_that_is_not_a_name_is_one_type_error(op):
    """load's aminmax and loss hooks compared op with a name first: an array raised NumPy's
    'truth value of an array ... is ambiguous' ValueError (test_fuzz found it)."""
    with pytest.raises(TypeError, match=r"^op must be an op name \(a string\)") as info:
        symgrad.load(op)
    assert "\n" not in str(info.value)
