"""`symgrad derive` leads with the rule (rule.py), and every command printed in its output or in a
docs page runs as printed.

* The rule comes first and fits one screen: forward, W's row, backward, the value at a tie; the
  value at a tie is checked against the README's definition of each policy, evaluated here by
  brute force on the tied pieces.
* `--full` prints the rule and then every step of the derivation, every item of each.
* The commands: the indented `symgrad ...` lines of derive's output, and the `symgrad ...` code
  spans of generated pages (catalog pages and an expression's page), each run with DIR replaced by
  a temporary folder: exit 0.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from fractions import Fraction
from pathlib import Path

import pytest

from symgrad import cli
from test_cli import REPO, assert_ok, run_all, run_symgrad

POLICIES = ("first", "last", "split", "all")
SCREEN = 40  # lines before the derivation's steps
STEPS = ("forward", "W-form", "raw derivative", "delta elimination", "final partials", "checks")


def readme_weights(values: list, policy: str) -> list[Fraction]:
    """w_i of max over pieces with these values, as README's table of tie policies defines them."""
    n = len(values)
    if policy in ("first", "last"):
        strict_before = policy == "first"
        return [Fraction(int(all((values[i] > values[j]) if (j < i) == strict_before else (values[i] >= values[j])
                                 for j in range(n) if j != i))) for i in range(n)]
    top = max(values)
    e = [Fraction(int(v == top)) for v in values]
    return [w / sum(e) for w in e] if policy == "split" else e


# (key, derive arguments, [(variable, index of the piece it is)], the tied pieces' values)
CASES = [(f"relu-{p}", ["relu", "--ties", p], [("x", 1)], [0, 0]) for p in POLICIES]
CASES += [(f"maximum-{p}", ["maximum", "--ties", p], [("a", 0), ("b", 1)], [0, 0]) for p in POLICIES]
CASES += [(f"max_pool2d-{p}", ["max_pool2d", "--kernel-size", "2", "--ties", p],
           [(f"x{i}", i) for i in range(4)], [0] * 4) for p in POLICIES]
CASES += [("max_pool2d-issue", ["max_pool2d", "--kernel-size", "3", "--stride", "2", "--padding", "1",
                                "--ties", "split"], [(f"x{i}", i) for i in range(9)], [0] * 9)]
EXPRESSION = ["--expr", "Max(x*y, x + y, 0)", "--ties", "split"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def outputs():
    """What `symgrad derive` prints for each case (cli.main in this process: the derivations are
    shared)."""
    argvs = {key: ["derive", *args] for key, args, *_ in CASES}
    argvs["expression"] = ["derive", *EXPRESSION]
    argvs["relu-full"] = ["derive", "relu", "--ties", "split", "--full"]
    argvs["max_pool2d-full"] = ["derive", "max_pool2d", "--kernel-size", "3", "--ties", "split", "--full"]
    found = {}
    for key, argv in argvs.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(argv) == 0, key
        found[key] = out.getvalue()
    return found


def _at_a_tie(out: str) -> dict[str, Fraction]:
    """{variable: value} from the rule's 'at a tie' lines."""
    block = out.split("at a tie:")[1].split("\n\n")[0]
    return {v: Fraction(val) for v, val in re.findall(r"d\w+/d(\w+) = ([-0-9/]+)", block)}


@pytest.mark.parametrize("key", [c[0] for c in CASES])
def test_the_rule_comes_first_on_one_screen(outputs, key):
    out = outputs[key]
    rule, _, rest = out.partition("The derivation, step by step:")
    assert rest.strip().startswith("symgrad derive ") and rest.strip().endswith("--full")
    assert len(rule.splitlines()) <= SCREEN, rule
    for label in ("== the rule ==", "forward:", "W's row:", "backward:", "at a tie:"):
        assert label in rule
    assert "== W-form ==" not in out  # the steps only with --full


@pytest.mark.parametrize("key", [c[0] for c in CASES])
def test_the_value_at_a_tie_is_the_policys(outputs, key):
    _, args, variables, values = next(c for c in CASES if c[0] == key)
    policy = args[args.index("--ties") + 1]
    expected = readme_weights(values, policy)
    assert _at_a_tie(outputs[key]) == {v: expected[i] for v, i in variables}


def test_full_prints_the_rule_then_every_item_of_every_step(outputs):
    for key in ("relu-full", "max_pool2d-full"):
        out = outputs[key]
        positions = [out.index("== the rule ==")] + [out.index(f"== {t} ==") for t in STEPS]
        assert positions == sorted(positions)
        assert "--full shows all" not in out and "The derivation, step by step" not in out
    # every item: 9 partials of the 3x3 window, each W-row entry E_0..E_8
    full = outputs["max_pool2d-full"]
    assert all(f"dy/dx{i} = " in full and f"E_{i} = " in full for i in range(9))


def _commands(text: str, pattern: str) -> list[str]:
    return [m.strip() for m in re.findall(pattern, text)]


def _argv(command: str, out: Path) -> list[str]:
    words = shlex.split(command.replace(" DIR", f" {out}"))
    assert words[0] == "symgrad", command
    return words[1:]


def test_the_commands_derive_prints_run_as_printed(outputs, cache, tmp_path):
    commands = []
    for key in ("relu-first", "expression"):
        commands += _commands(outputs[key], r"\n +(symgrad [^\n]+)")
    assert len(commands) == 3  # two --full commands and the expression's conventions command
    issue = _commands(outputs["max_pool2d-issue"], r"\n +(symgrad [^\n]+)")
    assert issue == ["symgrad derive max_pool2d --kernel-size 3 3 --stride 2 2 --padding 1 1 --ties split --full"]
    results = run_all({c: _argv(c, tmp_path) for c in commands}, cache)
    for c, r in results.items():
        assert_ok(r)


PAGES = ["max_unpool2d_k2x2_first.md"]


def test_the_commands_of_generated_pages_run_as_printed(cache, tmp_path):
    page = run_symgrad(["derive", *EXPRESSION, "--format", "markdown"], cache)
    assert_ok(page)
    texts = [page.stdout] + [(REPO / "generated" / "docs" / p).read_text() for p in PAGES]
    commands = sorted({c for t in texts for c in _commands(t, r"`(symgrad [^`]+)`")})
    assert sum("--expr" in c for c in commands) >= 3 and sum("generate" in c for c in commands) >= 2
    results = run_all({c: _argv(c, tmp_path / str(i)) for i, c in enumerate(commands)}, cache)
    for c, r in results.items():
        assert_ok(r)
        assert r.stdout, c
