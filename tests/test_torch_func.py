"""symgrad.torch ops under torch.func (grad, vmap, jacrev, jacfwd, jvp, hessian): symgrad's derived
backward and jvp, not PyTorch's (symgrad/torch_func.py).

Oracles: the NumPy module's backward and jvp (symgrad.load(...), itself checked against the SymPy
derivation elsewhere), compared bit for bit; a Python loop over examples for vmap; jacfwd for
jacrev (the ops are piecewise linear, so both are the same matrix of the module's W); PyTorch's own
gradient, which must differ where its tie rule is not the policy's.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
import symgrad.torch as st  # noqa: E402

F = torch.nn.functional
func = torch.func

# (op, params, PyTorch's own op, a tie-heavy example input); the inputs are ties everywhere; the
# params of catalog entries where one is near (their modules are derived by other tests anyway)
CASES = {
    "relu": ({}, F.relu, lambda: torch.tensor([[-1.0, 0.0, 0.0, 2.0], [0.0, 3.0, -0.0, 0.0]])),
    "max_pool2d": ({"kernel_size": 2}, lambda x: F.max_pool2d(x, 2),
                   lambda: torch.tensor([[[[1.0, 1.0, 0.0, 2.0], [1.0, 0.0, 2.0, 2.0],
                                           [5.0, 5.0, 5.0, 5.0], [5.0, 5.0, 5.0, 5.0]]]])),
    "amax": ({"dim": -1}, lambda x: torch.amax(x, dim=-1),
             lambda: torch.tensor([[1.0, 1.0, 0.0, 1.0], [2.0, 0.0, 2.0, -1.0]])),
}
# where PyTorch's own gradient is not the policy's on these inputs: relu's is 0 at 0 (split: 1/2;
# first: relu is max(0, x), its 0 piece first, as PyTorch's), max_pool2d's goes to the first
# maximum of a window (split shares it), amax's is shared evenly (first gives it all to the first)
DIFFERS = {("relu", "split"), ("max_pool2d", "split"), ("amax", "first")}
POLICIES = ("split", "first")


def _bits(t) -> np.ndarray:
    return np.ascontiguousarray(t.detach().numpy()).view(np.uint8)


def _same(a, b) -> bool:
    """Bit for bit, signs of zero included."""
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(_bits(a), _bits(b))


def _numpy_grad(name: str, ties: str, x: torch.Tensor) -> torch.Tensor:
    """The gradient of sum(op(x)) by the NumPy module's backward."""
    module = symgrad.load(name, ties=ties, **CASES[name][0])
    y, saved = module.forward(x.numpy())
    (g,) = module.backward(np.ones_like(y), saved)
    return torch.from_numpy(np.ascontiguousarray(g))


def _summed(f):
    return lambda x: f(x).sum()


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("name, dtype", [(name, torch.float64) for name in sorted(CASES)]
                         + [("relu", torch.float32)])  # float32: the cpu backend's C
def test_grad_is_the_numpy_modules_backward_not_pytorchs(name, ties, dtype):
    params, native, example = CASES[name]
    x = example().to(dtype)
    got = func.grad(_summed(st.op(name, ties=ties, **params)))(x)
    assert _same(got, _numpy_grad(name, ties, x.double()).to(dtype))
    theirs = func.grad(_summed(native))(x)
    assert torch.equal(got, theirs) == ((name, ties) not in DIFFERS)


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_of_grad_is_a_loop_over_examples(name, ties):
    params, _, example = CASES[name]
    f = func.grad(_summed(st.op(name, ties=ties, **params)))
    x = example().double()
    batch = torch.stack([x, -x, x.flip(-1)])  # each example has its own ties
    got = func.vmap(f)(batch)
    assert _same(got, torch.stack([_numpy_grad(name, ties, b) for b in batch]))
    inner = func.vmap(f, in_dims=1, out_dims=1)(batch)  # the batch in dim 1: moved
    assert _same(inner, torch.stack([_numpy_grad(name, ties, batch[:, k]) for k in range(x.shape[0])], 1))


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_jacrev_equals_jacfwd_and_the_jvp_is_the_modules(name, ties):
    params, _, example = CASES[name]
    f = st.op(name, ties=ties, **params)
    x = example().double()
    jr, jf = func.jacrev(f)(x), func.jacfwd(f)(x)
    assert _same(jr, jf) and jr.abs().sum() > 0
    v = torch.linspace(-1.0, 1.0, x.numel(), dtype=x.dtype).reshape(x.shape)
    module = symgrad.load(name, ties=ties, **params)
    y, saved = module.forward(x.numpy())
    out, tangent = func.jvp(f, (x,), (v,))
    assert _same(out, torch.from_numpy(y)) and _same(tangent, torch.from_numpy(module.jvp(v.numpy(), saved)))


def test_nn_modules_two_inputs_and_second_order():
    pool = st.MaxPool2d(2, ties="split")
    x = CASES["max_pool2d"][2]().double().expand(3, 2, 4, 4)  # vmap over N of (N, C, H, W) examples
    g = func.vmap(func.grad(_summed(pool)))(x)
    assert _same(g[1], func.grad(_summed(pool))(x[1]))
    maximum = st.op("maximum", ties="split")
    a = torch.tensor([[0.0, 1.0], [2.0, -1.0]], dtype=torch.float64)
    b = torch.zeros(2, dtype=torch.float64)  # unbatched: the same b for each example
    ga, gb = func.vmap(func.grad(lambda a, b: maximum(a, b).sum(), argnums=(0, 1)), in_dims=(0, None))(a, b)
    assert ga.tolist() == [[0.5, 1.0], [1.0, 0.0]] and gb.tolist() == [[0.5, 0.0], [0.0, 1.0]]
    relu = st.ReLU(ties="split")
    x = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
    assert func.grad(lambda x: func.grad(lambda x: (relu(x) ** 2).sum())(x).sum())(x).tolist() == [0.0, 0.5, 2.0]
    assert not func.hessian(_summed(relu))(x).any()  # piecewise linear: 0 almost everywhere


@pytest.mark.slow
@pytest.mark.parametrize("ties", ["split", "first", "last", "all", "min"])
@pytest.mark.parametrize("name", ["maxout", "max_pool1d", "adaptive_max_pool2d", "amin", "clamp", "hardtanh"])
def test_vmap_grad_and_jacobians_of_more_ops(name, ties):
    shapes = {"maxout": (2, 2, 4, 3), "max_pool1d": (2, 3, 6), "adaptive_max_pool2d": (2, 2, 4, 4),
              "amin": (2, 3, 4), "clamp": (2, 3, 4), "hardtanh": (2, 3, 4)}
    params = {"maxout": {"pieces": 2}, "max_pool1d": {"kernel_size": 2}, "adaptive_max_pool2d": {"output_size": 2},
              "amin": {"dim": 0}, "clamp": {"min": 0.0, "max": 1.0}, "hardtanh": {}}[name]
    try:
        f = st.op(name, ties=ties, **params)
        module = symgrad.load(name, ties=ties, **params)
    except ValueError:
        pytest.skip(f"{name} takes no ties={ties!r}")
    x = torch.randint(-1, 2, shapes[name]).double()
    got = func.vmap(func.grad(_summed(f)))(x)
    for k in range(x.shape[0]):
        y, saved = module.forward(x[k].numpy())
        assert _same(got[k], torch.from_numpy(np.ascontiguousarray(module.backward(np.ones_like(y), saved)[0])))
    assert _same(func.jacrev(f)(x[0]), func.jacfwd(f)(x[0]))


@pytest.mark.slow
def test_compiled_transforms_keep_the_policy_or_refuse():
    """torch.compile of torch.func.grad: the op runs the eager torch.func path (a graph break, so
    fullgraph=True raises) instead of differentiating the torch backend's forward without the policy
    (before: relu's gradient at 0 was 1, not split's 1/2)."""
    torch._dynamo.reset()
    relu = st.op("relu", ties="split")
    g = func.grad(_summed(relu))
    x = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
    with pytest.raises(Exception, match="disable"):
        torch.compile(g, backend="aot_eager", fullgraph=True)(x)
    torch._dynamo.reset()
    assert torch.compile(g, backend="aot_eager")(x).tolist() == [0.0, 0.5, 1.0]
