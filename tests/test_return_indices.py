"""return_indices, as PyTorch's functional and nn forms take it: max_pool1d/2d/3d,
adaptive_max_pool1d/2d/3d and fractional_max_pool2d/3d return (output, indices), the indices being
each window's winner as a flat position in its (N, C) plane, int64.

Oracle: PyTorch 2.13 CPU (F.*(..., return_indices=True)) under convention="torch", on tie-heavy
inputs holding NaN: the indices equal PyTorch's exactly (and the output, bit for bit)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")
F = torch.nn.functional

CASES = [
    ("max_pool1d", (2, 3, 11), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool1d", (3, 9), dict(kernel_size=2, dilation=2, ceil_mode=True)),
    ("max_pool2d", (2, 2, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool2d", (2, 2, 5, 5), dict(kernel_size=(2, 3), stride=1)),
    ("max_pool3d", (1, 2, 5, 4, 6), dict(kernel_size=2, stride=(1, 2, 2), padding=1)),
    ("adaptive_max_pool1d", (2, 3, 10), dict(output_size=4)),
    ("adaptive_max_pool2d", (2, 2, 7, 6), dict(output_size=(3, 4))),
    ("adaptive_max_pool3d", (1, 2, 5, 4, 6), dict(output_size=(2, 3, 4))),
    ("fractional_max_pool2d", (2, 2, 9, 8), dict(kernel_size=2, output_size=(4, 3))),
    ("fractional_max_pool3d", (1, 2, 6, 7, 5), dict(kernel_size=2, output_size=(3, 4, 2))),
]


def _inputs(name, shape, rng, dtype=np.float32):
    x = rng.integers(0, 3, size=shape).astype(dtype)  # ties
    x.flat[rng.choice(x.size, size=max(1, x.size // 10), replace=False)] = np.nan
    if name.startswith("fractional"):  # (N, C, d) samples in [0, 1)
        return x, rng.random(shape[:2] + (int(name[-2]),)).astype(dtype)
    return (x,)


def _torch(name, args, params):
    fn = getattr(F, name)
    if name.startswith("fractional"):
        x, u = args
        return fn(torch.tensor(x), params["kernel_size"], output_size=params["output_size"],
                  return_indices=True, _random_samples=torch.tensor(u))
    return fn(torch.tensor(args[0]), return_indices=True, **params)


@pytest.mark.parametrize("name,shape,params", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_indices_equal_pytorchs(name, shape, params):
    rng = np.random.default_rng(len(shape) * 7 + len(params))
    m = symgrad.load(name, convention="torch", return_indices=True, **params)
    assert m.PARAMS["return_indices"] is True
    for trial in range(3):
        args = _inputs(name, shape, rng)
        (y, indices), saved = m.forward(*args)
        want_y, want_i = _torch(name, args, params)
        assert indices.dtype == np.int64 and indices.shape == y.shape
        np.testing.assert_array_equal(indices, want_i.numpy())
        np.testing.assert_array_equal(y, want_y.numpy())
        # backward and jvp take the output's gradient as without indices
        plain = symgrad.load(name, convention="torch", **params)
        g = rng.standard_normal(y.shape).astype(np.float32)
        np.testing.assert_array_equal(m.backward(g, saved)[0], plain.backward(g, plain.forward(*args)[1])[0])


def test_default_is_false_and_split_is_refused():
    m = symgrad.load("max_pool1d", kernel_size=3, stride=2, return_indices=False)
    y, saved = m.forward(np.arange(7.0)[None])
    assert isinstance(y, np.ndarray)
    assert m is symgrad.load("max_pool1d", kernel_size=3, stride=2)  # the same op
    # the message says what is expected (test_fuzz's clear-error check found it did not)
    for op, params in (("max_pool2d", dict(kernel_size=2)), ("adaptive_max_pool1d", dict(output_size=3))):
        with pytest.raises(ValueError, match=f"^{op}: return_indices=True needs one winner per window: "
                                             f"ties must be 'first' or 'last', got ties='split'$"):
            symgrad.load(op, ties="split", return_indices=True, **params)
    with pytest.raises(TypeError, match="return_indices must be True or False"):
        symgrad.load("max_pool2d", kernel_size=2, return_indices=1)


def test_symgrad_torch_returns_output_and_indices_with_autograd():
    import symgrad.torch as st
    x = torch.tensor(np.random.default_rng(1).integers(0, 3, size=(2, 3, 6, 6)).astype(np.float32),
                     requires_grad=True)
    for f, want in ((st.op("max_pool2d", kernel_size=2, convention="torch", return_indices=True),
                     lambda v: F.max_pool2d(v, 2, return_indices=True)),
                    (st.MaxPool2d(2, convention="torch", return_indices=True),
                     lambda v: F.max_pool2d(v, 2, return_indices=True)),
                    (st.AdaptiveMaxPool2d((4, 3), convention="torch", return_indices=True),
                     lambda v: F.adaptive_max_pool2d(v, (4, 3), return_indices=True))):
        y, i = f(x)
        wy, wi = want(x)
        assert i.dtype == torch.int64 and not i.requires_grad
        assert torch.equal(i, wi) and torch.equal(y, wy)
        g = torch.randn(y.shape)
        (gx,) = torch.autograd.grad(y, x, g)
        assert torch.equal(gx, torch.autograd.grad(wy, x, g)[0])
    f = pickle.loads(pickle.dumps(st.op("max_pool1d", kernel_size=2, return_indices=True)))
    assert f(torch.ones(1, 4))[1].tolist() == [[0, 2]]


def test_symgrad_jax_refuses_return_indices_in_one_line():
    pytest.importorskip("jax")
    import symgrad.jax as sj
    with pytest.raises(ValueError, match="return_indices=True is PyTorch's"):
        sj.op("max_pool1d", kernel_size=2, return_indices=True)
    with pytest.raises(ValueError, match="loaded with return_indices=True"):
        sj.wrap(symgrad.load("max_pool1d", kernel_size=2, return_indices=True))


def test_cli_flag(tmp_path):
    out = subprocess.run([sys.executable, "-m", "symgrad", "generate", "max_pool1d", "--kernel-size",
                          "3", "--stride", "2", "--return-indices", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (path,) = tmp_path.glob("*.py")
    text = path.read_text()
    assert "--return-indices" in text.splitlines()[1] and "indices" in path.name
    assert "def indices(saved" in text


def test_cuda_backend_refuses_return_indices_in_one_line():
    with pytest.raises(ValueError, match="return_indices=True is in the NumPy backend only"):
        symgrad.generate("max_pool2d", "/nonexistent", backend="cuda", kernel_size=2,
                         return_indices=True)


def test_symgrad_check_takes_a_module_with_return_indices():
    m = symgrad.load("max_pool1d", kernel_size=2, stride=1, return_indices=True)
    report = symgrad.check(m, np.array([[[1.0, 1.0, 0.5, 2.0, 2.0]]]))
    assert report.ok, report
