"""tools/opinfo.py (PyTorch's OpInfo samples through symgrad) on a tiny subset: it runs, counts,
and finds relu's samples bit-equal to PyTorch.  Slow: importing PyTorch's op_db takes seconds."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # PyTorch's testing package imports it

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("opinfo_tool", ROOT / "tools" / "opinfo.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["opinfo_tool"] = mod
    spec.loader.exec_module(mod)
    mod._imports()
    return mod


@pytest.mark.slow
def test_relu_samples_equal_pytorch_and_a_difference_is_counted(capsys):
    tool = _tool()
    tool.main(["--only", "nn.functional.relu", "--dtypes", "float32", "--backends", "numpy",
               "--frameworks", "torch", "--limit", "3"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| torch | nn.functional.relu | float32"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    samples, fwd, bwd, differing = map(int, cells[4:8])
    assert samples == 9 and fwd == bwd == 9 and differing == 0  # 3 samples x 3 variants
    # the comparison sees a sign of zero, and a differing sample is counted as such
    assert not tool.same_bits(np.array([0.0]), np.array([-0.0]))
    case = tool.Case("relu", {}, [np.array([1.0, -2.0])], [0], lambda t: tool.torch.relu(t) * 2, elementwise=True)
    g = np.ones(2)
    tally = tool.Tally()
    tool.compare(case, g, tool.torch_run(case, g), "numpy", "torch", tally, "torch", "seeded")
    assert tally.n["samples"] == 1 and tally.n["differing"] == 1 and tally.n["contradiction"] == 0


@pytest.mark.slow
def test_xla_shape_contradiction_is_decided_per_sample():
    """A JAX broadcast sample whose gradient differs is classed as XLA contradicting itself by
    shape only where symgrad equals JAX's reduce_sum of each output's terms alone (a (2, 2) block
    summed whole by JAX), never for a gradient off by one."""
    pytest.importorskip("jax")
    tool = _tool()
    case = tool.Case("maximum", {}, [np.full((2, 2), -np.inf, np.float16), np.zeros((1, 1), np.float16)],
                     [0, 1], None, lambda a, b: tool._jnp()[1].maximum(a, b), elementwise=True)
    rng = np.random.default_rng(12)
    classed = 0
    for _ in range(20):
        g = (rng.standard_normal((2, 2)) * np.exp2(rng.integers(-3, 8, (2, 2)))).astype(np.float16)
        want, got = tool.jax_run(case, g), tool.symgrad_run(case, g, "numpy", "jax")
        if not tool.same_bits(got[1][1], want[1][1]):
            classed += tool.xla_shape_contradiction(case, g, got, want)
            off = (got[0], [got[1][0], got[1][1] + np.float16(1)])
            assert not tool.xla_shape_contradiction(case, g, off, want)
    assert classed > 0


@pytest.mark.slow
def test_a_lane_contradiction_on_either_path_is_decided_per_sample():
    """PyTorch's softshrink fills the zero band with x * 0 on its scalar path (-0 for -lambd <= x <= -0)
    and +0 in its SIMD lanes (the preset's): a short tensor runs the scalar path, so the preset
    differs from it while equal to PyTorch's lanes element by element; a forward off by a sign
    is never classed so."""
    tool = _tool()
    x = np.array([-0.0, -0.25, 0.75, -1.0], np.float16)
    case = tool.Case("softshrink", {"lambd": 0.5}, [x], [0], lambda t: tool.F.softshrink(t, 0.5), elementwise=True)
    g = np.ones(4, np.float16)
    want, got = tool.torch_run(case, g), tool.symgrad_run(case, g, "numpy", "torch")
    assert not tool.same_bits(got[0], want[0])  # the whole (short) tensor: the scalar path's -0
    assert tool.lane_contradiction(case, g, got, want)
    flipped = (np.where(got[0] == 0, -got[0], got[0] + np.float16(1)), got[1])
    assert not tool.lane_contradiction(case, g, flipped, want)
