"""The tutorials of the documentation site run (at small sizes) and what the site shows is what
they print: examples/bertoin_digits.py (Bertoin et al.'s bifurcation measurement on sklearn's
digits with symgrad's relu).

The oracle for the counted kinks: the same epoch replayed with torch.relu (relu'(0) = 0 in
PyTorch, as ties="first": the same training, bit for bit) and its pre-activations' exact zeros
counted here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install \".[test]\")")

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bertoin_digits", ROOT / "examples" / "bertoin_digits.py")
bertoin = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bertoin  # (its dataclass looks its module up)
spec.loader.exec_module(bertoin)


def replayed_zeros(width: int, dtype: str, seed: int, samples: int, batch: int) -> int:
    """Exact zeros of the relu inputs over the epoch, trained with torch.relu and autograd."""
    import numpy as np
    dt = getattr(torch, dtype)
    x, y = bertoin.digits(samples, dt)
    model = bertoin.mlp(width, seed, dt)
    order = np.random.default_rng(seed).permutation(len(x))
    zeros = 0
    for start in range(0, len(x), batch):
        idx = torch.from_numpy(order[start:start + batch])
        model.zero_grad()
        p1 = model[0](x[idx])
        p2 = model[1](torch.relu(p1))
        zeros += int((p1 == 0).sum() + (p2 == 0).sum())
        torch.nn.functional.cross_entropy(model[2](torch.relu(p2)), y[idx]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    return zeros


def test_the_bifurcation_tutorial_runs_small(capsys):
    rows = bertoin.main(["--widths", "8", "--inits", "2", "--samples", "64", "--batch", "32"])
    out = capsys.readouterr().out
    assert out == bertoin.table(rows)
    assert [(r.dtype, r.width) for r in rows] == [(d, 8) for d in bertoin.DTYPES]
    for r in rows:
        assert r.inits == 2 and r.batches == 2 * 2
        assert (r.differing_batches > 0) <= (r.kink_hits > 0)  # gradients differ only at a kink
        assert r.bifurcated <= r.differing_batches
    assert all(r.kink_hits == 0 for r in rows if r.dtype == "float64")


@pytest.mark.slow
def test_the_counted_kinks_are_the_replayed_zeros():
    """A whole epoch of digits at width 512 in float16 meets a kink (seed 0: one); float32 none."""
    for dtype, width, seed in (("float16", 512, 0), ("float32", 512, 0)):
        differing, _, hits = bertoin.epoch(width, dtype, seed, 1797, 32)
        assert hits == replayed_zeros(width, dtype, seed, 1797, 32)
        assert (hits > 0) == (dtype == "float16") and (differing > 0) == (dtype == "float16")


def test_the_site_shows_the_scripts_table_and_picture():
    page = (ROOT / "docs" / "tutorials.md").read_text()
    table = (ROOT / "docs" / "tutorials" / "bertoin_digits.md").read_text()
    assert table.splitlines()[:2] == bertoin.table([]).splitlines()[:2]
    assert "tutorials/bertoin_digits.md" in page and "tutorials/bertoin_digits.svg" in page
    assert "python examples/bertoin_digits.py" in page
    assert (ROOT / "docs" / "tutorials" / "bertoin_digits.svg").read_text().startswith("<svg")
