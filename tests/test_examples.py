"""The seed examples run, and say what the frameworks say (PyTorch and JAX computed here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

if os.environ.get("CI"):
    import jax
    import torch
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
    jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax jaxlib)")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402


def example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["relu_vs_clamp", "max_of_sums", "w_matrix", "run_max_pool2d", "train_torch"])
def test_example_runs(name, tmp_path):
    args = [sys.executable, str(EXAMPLES / f"{name}.py")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if name == "run_max_pool2d":
        subprocess.run([sys.executable, "-m", "symgrad", "generate", "max_pool2d", "--kernel-size", "3",
                        "--stride", "2", "--padding", "1", "--out", str(tmp_path)], check=True, env=env)
        args.append(str(tmp_path))
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def _torch_w1_grad(act):
    ex = example("relu_vs_clamp")
    w1 = torch.tensor(ex.W1, requires_grad=True)
    loss = ((act(torch.tensor(ex.X) @ w1) @ torch.tensor(ex.W2) - torch.tensor(ex.Y)) ** 2).sum()
    loss.backward()
    return w1.grad.numpy()


def _jax_w1_grad(act):
    ex = example("relu_vs_clamp")
    loss = lambda w1: ((act(jnp.asarray(ex.X) @ w1) @ jnp.asarray(ex.W2) - jnp.asarray(ex.Y)) ** 2).sum()  # noqa: E731
    return np.asarray(jax.grad(loss)(jnp.asarray(ex.W1)))


def test_relu_vs_clamp_equals_pytorch_and_jax():
    import symgrad
    ex = example("relu_vs_clamp")
    ours_relu = ex.w1_grad(symgrad.load("relu", convention="torch"))
    ours_clamp = ex.w1_grad(symgrad.load("clamp", convention="torch", min=0))
    torch_relu = _torch_w1_grad(torch.relu)
    torch_clamp = _torch_w1_grad(lambda t: torch.clamp(t, min=0))
    np.testing.assert_array_equal(ours_relu, torch_relu)
    np.testing.assert_array_equal(ours_clamp, torch_clamp)
    assert (torch_relu - torch_clamp != 0).sum() == 1  # the one kink makes the difference
    jax_relu = ex.w1_grad(symgrad.load("relu", convention="jax"))
    jax_max = ex.w1_grad(ex.MaximumWithZero("jax"))
    np.testing.assert_array_equal(jax_relu, _jax_w1_grad(jax.nn.relu))
    np.testing.assert_array_equal(jax_max, _jax_w1_grad(lambda h: jnp.maximum(h, 0.0)))
    assert (jax_relu - jax_max != 0).sum() == 1


def test_max_of_sums_equals_pytorch():
    ex = example("max_of_sums")
    rng = np.random.default_rng(5)
    for _ in range(5):
        t1, t2 = rng.random(10), rng.random(10)
        m, g1, g2 = ex.grads(t1, t2)
        a, b = torch.tensor(t1, requires_grad=True), torch.tensor(t2, requires_grad=True)
        torch.max(a.sum(), b.sum()).backward()
        assert m == max(t1.sum(), t2.sum())
        np.testing.assert_array_equal(g1, a.grad.numpy())
        np.testing.assert_array_equal(g2, b.grad.numpy())
        assert {g1[0], g2[0]} == {0.0, 1.0}  # zeros for the smaller sum, never None


def test_w_matrix_is_the_jacobian():
    ex = example("w_matrix")
    x = ex.X
    jac = torch.autograd.functional.jacobian(
        lambda t: torch.nn.functional.max_pool1d(t[None], kernel_size=2, stride=1)[0], torch.tensor(x))
    np.testing.assert_array_equal(ex.pool_w("first"), jac.numpy())  # PyTorch's pooling is 'first'
    torch_amax_jac = torch.autograd.functional.jacobian(lambda t: torch.amax(t), torch.tensor(x))
    np.testing.assert_array_equal(ex.w_row("split")[0], torch_amax_jac.numpy())  # amax splits
    for ties in ("first", "last", "split"):
        assert ex.w_row(ties).sum() == 1.0


def test_training_with_symgrad_ops_lowers_the_loss():
    losses = example("train_torch").main(steps=40)
    assert losses[-1] < 0.5 * losses[0]
