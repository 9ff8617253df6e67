"""`symgrad conventions --expr`: an expression's gradient at each kink and tie, per policy and under
PyTorch's and JAX's own autodiff, compared with gradients the tests compute themselves (torch and
jax on the CPU, the policies from the README's definitions)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from symgrad.cli import main

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

# goodfire-ai/spd#621: upper_leaky_hard_sigmoid, where(x > 1, 1 + alpha*(x - 1), clip(x, 0, 1))
LEAKY = "Piecewise((1 + 0.01*(x - 1), x > 1), (min(max(x, 0), 1), True))"
COLUMNS = ["at", "tie", "first", "last", "split", "all", "torch", "jax", "torch vs jax"]


def table(capsys, expr, *more):
    assert main(["conventions", "--expr", expr, *more]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    rows = [dict(zip(COLUMNS, ln[2:-2].split(" | "))) for ln in lines[1:]]
    return rows, out


def value(cell: str) -> list[float]:
    from fractions import Fraction
    return [float(Fraction(p)) for p in cell.split(" ; ")]


def torch_grads(f, *points):
    xs = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in zip(*points)]
    return [g.numpy() for g in torch.autograd.grad(f(*xs).sum(), xs)]


def jax_grads(f, *points):
    with jax.enable_x64(True):
        xs = [jnp.asarray(p, dtype=jnp.float64) for p in zip(*points)]
        return [np.asarray(g) for g in jax.grad(lambda *a: jnp.sum(f(*a)),
                                               argnums=tuple(range(len(xs))))(*xs)]


def test_leaky_hard_sigmoid_frameworks_disagree_at_both_kinks(capsys):
    rows, out = table(capsys, LEAKY)
    assert [r["at"] for r in rows] == ["x = 0", "x = 1"]
    t = torch_grads(lambda x: torch.where(x > 1, 1 + 0.01 * (x - 1), torch.clamp(x, 0, 1)),
                    (0.0,), (1.0,))[0]
    j = jax_grads(lambda x: jnp.where(x > 1, 1 + 0.01 * (x - 1), jnp.clip(x, 0, 1)),
                  (0.0,), (1.0,))[0]
    assert list(t) == [1.0, 1.0] and list(j) == [0.5, 0.5]  # spd#621, reproduced here
    for k, r in enumerate(rows):
        assert value(r["torch"]) == [t[k]] and value(r["jax"]) == [j[k]]
        assert r["torch vs jax"] == "DIFFER"
        # the tie at x = 0 is max(x, 0) and at x = 1 min(., 1), the varying piece written first:
        # first gives it the whole gradient, last none, split half, all the whole
        assert [r[p] for p in ("first", "last", "split", "all")] == ["1", "0", "1/2", "1"]
    assert "Piecewise: x = 1" in rows[1]["tie"]


def test_max_min_form_frameworks_agree_with_split(capsys):
    expr = "max(0.01*x, min(x, 0.01*x + 0.99))"
    rows, _ = table(capsys, expr)
    assert [r["at"] for r in rows] == ["x = 0", "x = 1"]
    t = torch_grads(lambda x: torch.maximum(0.01 * x, torch.minimum(x, 0.01 * x + 0.99)),
                    (0.0,), (1.0,))[0]
    j = jax_grads(lambda x: jnp.maximum(0.01 * x, jnp.minimum(x, 0.01 * x + 0.99)),
                  (0.0,), (1.0,))[0]
    for k, r in enumerate(rows):
        assert value(r["torch"]) == [t[k]] and value(r["jax"]) == [j[k]]
        assert r["torch vs jax"] == "same"
        assert value(r["split"]) == [0.505]  # half of 0.01 and half of 1
        assert value(r["all"]) == [1.01]
    # x = 0: 0.01*x is written first; x = 1: x is
    assert value(rows[0]["first"]) == [0.01] and value(rows[0]["last"]) == [1.0]
    assert value(rows[1]["first"]) == [1.0] and value(rows[1]["last"]) == [0.01]


def test_bivariate_max_at_x_equal_y(capsys):
    rows, _ = table(capsys, "max(x, y)")
    assert len(rows) == 1 and rows[0]["at"] == "x = 1, y = 1" and rows[0]["tie"] == "max: x = y"
    r = rows[0]
    assert [value(r[p]) for p in ("first", "last", "split", "all")] == \
        [[1, 0], [0, 1], [0.5, 0.5], [1, 1]]
    t = torch_grads(torch.maximum, (1.0, 1.0))
    j = jax_grads(jnp.maximum, (1.0, 1.0))
    assert value(r["torch"]) == [float(g[0]) for g in t]
    assert value(r["jax"]) == [float(g[0]) for g in j]
    assert r["torch vs jax"] == "same"


def test_inputs_order_and_an_inactive_tie_left_out(capsys):
    rows, _ = table(capsys, "max(x*y, x + y, 0)", "--inputs", "y", "x")
    # x*y = 0 at x = 0 counts only where x + y <= 0 (there it attains the max)
    for r in rows:
        y, x = (float(s.split(" = ")[1]) for s in r["at"].split(", "))
        pieces = sorted([x * y, x + y, 0.0])
        assert pieces[-1] == pieces[-2]  # the two largest tie


def test_a_numeric_kink_that_is_no_double(capsys):
    import math
    rows, out = table(capsys, "max(pi*x**2, 1)")
    r = 1 / math.sqrt(math.pi)
    assert [r_["at"] for r_ in rows] == \
        [f"x = {v!r} (numeric) (no tie in float64)" for v in (-r, r)]
    assert math.pi * r * r != 1.0
    assert "(no tie in float64)\": the point is not a double" in out


def test_missing_framework_column_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    rows, out = table(capsys, LEAKY)
    assert [r["jax"] for r in rows] == ["not installed"] * 2
    assert [r["torch"] for r in rows] == ["1", "1"]
    assert [r["torch vs jax"] for r in rows] == ["", ""]
    assert [ln for ln in out.splitlines() if "pip install" in ln] == \
        ['jax column: not installed (`pip install "jax[cpu]"`)']


def test_no_kinks_is_one_line(capsys):
    assert main(["conventions", "--expr", "x*x + 1"]) == 0
    assert "no kinks or ties found" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--expr", "max(x, y"],
    ["--expr", "x.real"],
    ["--expr", "max(x, y)", "--inputs", "x"],
    ["--expr", "3"],
    ["--expr", "max(x, 0)", "--update", "README.md"],
    ["--inputs", "x"],
])
def test_bad_input_is_one_error_line(capsys, argv):
    assert main(["conventions", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("symgrad: error: ")


def test_docs_example_is_the_printed_table(capsys):
    from pathlib import Path
    readme = (Path(__file__).parent.parent / "docs" / "conventions.md").read_text()
    assert f'symgrad conventions --expr "{LEAKY}"' in readme
    _, out = table(capsys, LEAKY)
    printed = "\n".join(ln for ln in out.splitlines() if ln.startswith("|"))
    assert printed in readme
