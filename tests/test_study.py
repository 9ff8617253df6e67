"""symgrad.study: counting ties, kinks and NaN per op and step from symgrad.torch and symgrad.jax,
running ops under another policy, and comparing a batch's gradients under two policies.

Oracles written here from the README's definitions: an elementwise op's kink is where its pieces
tie (relu: x = 0; maximum: a = b); a pooling window has a tie where its maximum is attained more
than once (NaNs tie with each other, and a window holding a NaN is a NaN output; padding never
wins); relu'(0) is 0 under first and 1 under last; the gradients of a two-layer MLP written out by
hand.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from symgrad import study

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import symgrad.jax as sj  # noqa: E402
import symgrad.torch as st  # noqa: E402

POOL = dict(kernel_size=3, stride=2, padding=1)  # overlapping windows, with padding


def tie_heavy(shape, seed, nan=0.02):
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=shape).astype(np.float32)
    x[rng.random(shape) < nan] = np.nan
    return x


def windows_oracle(x: np.ndarray, k: int, s: int, p: int) -> tuple[int, int, int]:
    """(windows, windows with a tie, windows with NaN) of max_pool2d over the last two axes."""
    h, w = x.shape[-2:]
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    ties = nans = 0
    for plane in x.reshape(-1, h, w):
        for i, j in itertools.product(range(oh), range(ow)):
            vals = [plane[r, c] for r in range(i * s - p, i * s - p + k) for c in range(j * s - p, j * s - p + k)
                    if 0 <= r < h and 0 <= c < w]
            n_nan = sum(np.isnan(v) for v in vals)
            top = max(v for v in vals if not np.isnan(v)) if n_nan < len(vals) else None
            tied = n_nan >= 2 if n_nan else sum(v == top for v in vals) >= 2
            ties += tied
            nans += n_nan > 0
    return x.reshape(-1, h, w).shape[0] * oh * ow, ties, nans


def expected(x, a, b):
    """{op name: (outputs, at a tie, NaN)} for relu(x), maximum(a, b), max_pool2d(x)."""
    finite = ~np.isnan(a) & ~np.isnan(b)
    return {"relu": (x.size, int(np.sum(x == 0)), int(np.isnan(x).sum())),
            "maximum": (a.size, int(np.sum((a == b) & finite)) + int(np.sum(np.isnan(a) & np.isnan(b))),
                        int(np.sum(~finite))),
            "max_pool2d": windows_oracle(x, POOL["kernel_size"], POOL["stride"], POOL["padding"])}


def by_op(counts: dict) -> dict:
    return {label.split("(")[0]: (c.outputs, c.at_tie, c.nan) for label, c in counts.items()}


def test_torch_counts_per_op_and_step():
    x, a, b = tie_heavy((2, 3, 9, 8), 0), tie_heavy((5, 7), 1), tie_heavy((5, 7), 2)
    relu, maximum, pool = st.op("relu"), st.op("maximum"), st.op("max_pool2d", **POOL)
    xt = torch.from_numpy(x).requires_grad_()
    with study.TieCounter() as c:
        pool(relu(xt)).nansum().backward()  # the counts are of the inputs each op sees
        c.step()
        maximum(torch.from_numpy(a), torch.from_numpy(b))
        relu(xt)
    relu_x = np.where(np.isnan(x), x, np.maximum(x, 0))
    want = expected(x, a, b)
    assert by_op(c.steps[0]) == {"relu": want["relu"], "max_pool2d": expected(relu_x, a, b)["max_pool2d"]}
    assert by_op(c.steps[1]) == {"relu": want["relu"], "maximum": want["maximum"]}
    assert all(cnt.calls == 1 for step in c.steps for cnt in step.values())
    assert by_op(c.totals())["relu"] == tuple(2 * v for v in want["relu"])
    # outside the counter nothing is counted, and the op class is as it was
    relu(xt)
    assert sum(cnt.calls for cnt in c.totals().values()) == 4
    assert st.SymgradOp.__call__.__name__ == "__call__" and "study" not in st.SymgradOp.__call__.__module__


def test_jax_counts_under_jit_and_grad():
    x, a, b = tie_heavy((2, 3, 9, 8), 3), tie_heavy((5, 7), 4), tie_heavy((5, 7), 5)
    relu, maximum, pool = sj.op("relu"), sj.op("maximum"), sj.op("max_pool2d", **POOL)
    with study.TieCounter() as c:
        f = jax.jit(lambda a, b: maximum(a, b).sum())
        jax.grad(f)(jnp.asarray(a), jnp.asarray(b))
        c.step()
        pool(jnp.asarray(x))
    want = expected(x, a, b)
    assert by_op(c.steps[0]) == {"maximum": want["maximum"]}
    assert by_op(c.steps[1]) == {"max_pool2d": want["max_pool2d"]}
    assert "study" not in sj._Op.__call__.__module__


def test_every_counts_one_call_in_n():
    relu = st.op("relu")
    x = torch.zeros(10)
    with study.TieCounter(every=3) as c:
        for _ in range(7):
            relu(x)
    assert by_op(c.totals()) == {"relu": (30, 30, 0)} and c.totals()["relu(ties=first)"].calls == 3


@pytest.mark.parametrize("ties, slope", [("first", 0.0), ("last", 1.0), ("split", 0.5), ("all", 1.0)])
def test_policy_runs_every_op_under_another_policy(ties, slope):
    x = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    relu = st.op("relu")  # its own policy: first
    with study.policy(ties):
        relu(x).sum().backward()
    assert x.grad.tolist() == [0.0, slope, 1.0]
    with study.policy(ties):
        g = jax.grad(lambda v: sj.op("relu")(v).sum())(jnp.array([-1.0, 0.0, 2.0]))
    assert np.asarray(g).tolist() == [0.0, slope, 1.0]


def _mlp_torch():
    relu = st.op("relu")
    lin1, lin2 = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    with torch.no_grad():
        lin1.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
        lin1.bias.zero_()
        lin2.weight.copy_(torch.tensor([[1.0, 1.0]]))
        lin2.bias.zero_()
    model = torch.nn.Sequential(lin1, lin2)
    x = torch.tensor([[1.0, 2.0]])
    return model, lambda: lin2(relu(lin1(x))).sum()


# the hidden pre-activations are (0, 3): dL/dpre = (relu'(0), 1), relu'(0) = 0 (first), 1 (last)
HAND = {"first": {"w1": [[0, 0], [1, 2]], "b1": [0, 1], "w2": [[0, 3]], "b2": [1]},
        "last": {"w1": [[1, 2], [1, 2]], "b1": [1, 1], "w2": [[0, 3]], "b2": [1]}}
DIFFER = {"w1": (2, 2.0), "b1": (1, 1.0), "w2": (0, 0.0), "b2": (0, 0.0)}


def test_compare_torch_reports_which_gradients_differ_and_by_how_much():
    model, loss = _mlp_torch()
    cmp = study.compare_torch(model, loss)
    assert cmp.differ
    names = dict(zip(["0.weight", "0.bias", "1.weight", "1.bias"], ["w1", "b1", "w2", "b2"]))
    for p in cmp.parameters:
        assert (p.differing, p.max_abs) == DIFFER[names[p.name]]
    assert model[0].weight.grad.tolist() == HAND["last"]["w1"]  # left as b's
    w1 = np.array(HAND["first"]["w1"], float)
    assert cmp.parameters[0].relative == pytest.approx(np.linalg.norm(w1 - HAND["last"]["w1"]) / np.linalg.norm(w1))
    assert "| `0.weight` | 4 | 2 |" in cmp.table()
    same = study.compare_torch(model, loss, "first", "first")
    assert not same.differ


def test_compare_jax_reports_which_gradients_differ():
    relu = sj.op("relu")
    params = {"w1": jnp.array([[0.0, 1.0], [0.0, 1.0]]), "b1": jnp.zeros(2),
              "w2": jnp.array([[1.0], [1.0]]), "b2": jnp.zeros(1)}
    x = jnp.array([[1.0, 2.0]])

    def loss(p, x):
        return (relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]).sum()
    cmp = study.compare_jax(loss, params, x)
    got = {p.name.strip("[]'"): (p.differing, p.max_abs) for p in cmp.parameters}
    assert got == DIFFER  # w1 is the transpose of torch's weight: the same counts


@pytest.mark.parametrize("make", [lambda: study.TieCounter(every=0), lambda: study.TieCounter(every=1.5),
                                  lambda: study.policy("random").__enter__()])
def test_bad_settings_are_one_line_errors(make):
    with pytest.raises(ValueError) as e:
        make()
    assert "\n" not in str(e.value)


def test_the_study_page_snippets_run_as_printed(capsys):
    """docs/study.md's Python blocks, run as printed: the counts and the comparison they describe."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parent.parent / "docs" / "study.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 3
    for code in blocks:
        exec(compile(code, "docs/study.md", "exec"), {})
    out = capsys.readouterr().out
    assert "| 0 | `relu(ties=first)` | 1 | 8 | 3 | 1 |" in out  # 3 kinks of 8, as the page says
    assert "Counts(calls=1, outputs=3, at_tie=1, nan=0)" in out
    assert "True\n" in out and "| `0.weight` | 4 | 2 |" in out and "| `0.bias` | 2 | 1 |" in out
