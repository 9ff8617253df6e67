"""symgrad.torch on the torch backend: under torch.compile and on devices other than the CPU, the
elementwise ops and expressions run the torch backend's module inside an autograd.Function that
Dynamo traces through (no graph break, Inductor fuses it); eagerly on the CPU today's path.

Oracles: the NumPy backend's module (bit for bit), symgrad.torch's eager CPU path (the NumPy or
compiled C module), and PyTorch's own forward-mode AD and double backward."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import symgrad  # noqa: E402
import symgrad.torch as st  # noqa: E402

# a fresh process: the model is compiled (static, then dynamic=True) and run before any eager
# call; its outputs and gradients are compared with eager's and with the NumPy modules' own
COMPILE_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    import symgrad, symgrad.torch as st

    torch.set_num_threads(1)
    dynamic = sys.argv[1] == "dynamic"

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 6)
            self.relu = st.ReLU(ties="split")
            self.hardtanh = st.Hardtanh(ties="split")
            self.maximum = st.op("maximum", ties="split")
            self.expr = st.expr("Max(x*y, x + y, 0)", ties="split")

        def forward(self, x1, x2, a, b, e1, e2):
            return (self.relu(self.linear(x1)), self.relu(x2), self.hardtanh(x2 * 2),
                    self.maximum(a, b), self.expr(e1, e2))

    def inputs(n):
        g = torch.Generator().manual_seed(n)
        x1 = torch.randn(n, 6, generator=g)
        x2 = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -0.5] * n).reshape(n, 6)
        a = torch.randn(n, 6, generator=g).round()
        b = a.clone(); b[::2] = torch.randn(b[::2].shape, generator=g).round()  # ties
        e1, e2 = a.clone(), b.clone()
        return [t.requires_grad_(True) for t in (x1, x2, a, b, e1, e2)]

    def run(fn, xs, weights):
        outs = fn(*xs)
        loss = sum((o * w).sum() for o, w in zip(outs, weights))
        grads = torch.autograd.grad(loss, xs + list(model.parameters()))
        return [o.detach() for o in outs], [g.detach() for g in grads]

    torch.manual_seed(0)
    model = Model()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    report = {}
    for n in (4, 5):  # dynamic: a second size reuses the graph
        xs = inputs(n)
        weights = [torch.linspace(-2, 2, 6 * n).reshape(n, 6) for _ in range(5)]
        c_outs, c_grads = run(compiled, xs, weights)  # compiled first: no eager call before it
        e_outs, e_grads = run(model, xs, weights)
        report[f"outputs_{n}"] = all(torch.equal(c, e) for c, e in zip(c_outs, e_outs))
        report[f"grads_{n}"] = all(torch.equal(c, e) for c, e in zip(c_grads, e_grads))
        # the compiled gradients against the NumPy modules' backward, bit for bit (float32)
        mods = [symgrad.load("relu", ties="split"), symgrad.load("hardtanh", ties="split"),
                symgrad.load("maximum", ties="split"),
                symgrad.load_expr("Max(x*y, x + y, 0)", ties="split")]
        x1, x2, a, b, e1, e2 = [t.detach().numpy() for t in xs]
        w = [t.numpy() for t in weights]
        want = []
        _, s = mods[0].forward(x2); want.append(mods[0].backward(w[1], s)[0])
        _, s = mods[1].forward(x2 * 2); want.append(2 * mods[1].backward(w[2], s)[0])
        _, s = mods[2].forward(a, b); want += list(mods[2].backward(w[3], s))
        _, s = mods[3].forward(e1, e2); want += list(mods[3].backward(w[4], s))
        got = [c_grads[1].numpy()] + [g.numpy() for g in c_grads[2:6]]
        # x2's gradient is relu's plus hardtanh's: compare the sum as the NumPy backends give it
        got_x2 = got[0]
        want_x2 = want[0] + want[1]
        report[f"numpy_{n}"] = bool(np.array_equal(got_x2.view(np.uint32), want_x2.view(np.uint32)) and all(
            np.array_equal(g.view(np.uint32), v.view(np.uint32)) for g, v in zip(got[1:], want[2:])))
    if not dynamic:
        explained = torch._dynamo.explain(model)(*inputs(4))
        report["graph_breaks"] = explained.graph_break_count
        report["graphs"] = explained.graph_count
    print(json.dumps(report))
""")


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_compile_fullgraph_before_any_eager_call(mode, tmp_path):
    env = dict(os.environ, SYMGRAD_CACHE_DIR=os.environ.get("SYMGRAD_CACHE_DIR", str(tmp_path / "cache")))
    out = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, mode], capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    import json
    report = json.loads(out.stdout.strip().splitlines()[-1])
    want = {"outputs_4": True, "grads_4": True, "numpy_4": True, "outputs_5": True, "grads_5": True,
            "numpy_5": True}
    if mode == "static":  # torch._dynamo.explain: one graph, no break
        want.update(graph_breaks=0, graphs=1)
    assert report == want, report


def _tensors(*arrays, requires_grad=True):
    return [torch.tensor(a, requires_grad=requires_grad) for a in arrays]


def test_the_op_holds_the_torch_module_and_window_ops_do_not():
    relu = st.op("relu", ties="split")
    assert relu.torch_module is not None and relu.torch_module.BACKEND == "torch"
    pool = st.op("max_pool2d", ties="first", kernel_size=2)  # pooling and maxout: built
    assert pool.torch_module is not None and pool.torch_module.OP == "max_pool2d"
    assert st.op("amax", ties="split").torch_module.OP == "amax"  # reductions: built
    # the torch preset of amax too (jvp by at::sum), and nanmax (NaN skipped)
    assert st.op("amax", dim=-1, convention="torch").torch_module.OP == "amax"
    assert st.op("nanmax", dim=-1).torch_module.OP == "nanmax"


def test_the_native_function_equals_numpy_forward_backward_and_jvp():
    """The autograd.Function (eager form, with jvp) on CPU tensors: forward, backward through
    autograd, forward-mode AD, against the NumPy module bit for bit."""
    fn = st.op("maximum", ties="split")
    mod = symgrad.load("maximum", ties="split")
    a = np.array([0.0, -0.0, 1.0, np.nan, 2.0, -np.inf, 3.0], dtype=np.float32)
    b = np.array([-0.0, 0.0, 1.0, 1.0, np.nan, -np.inf, 1.0], dtype=np.float32)
    g = np.linspace(-1, 1, a.size).astype(np.float32)
    ta, tb = _tensors(a, b)
    y = fn._native[0].apply(ta, tb)
    y_np, saved = mod.forward(a, b)
    assert np.array_equal(y.detach().numpy().view(np.uint32), y_np.view(np.uint32)) or \
        np.array_equal(np.isnan(y.detach().numpy()), np.isnan(y_np))
    ga, gb = torch.autograd.grad(y, (ta, tb), torch.tensor(g))
    want = mod.backward(g, saved)
    for got, w in zip((ga, gb), want):
        assert np.array_equal(got.numpy().view(np.uint32), w.view(np.uint32))
    import torch.autograd.forward_ad as fwAD
    ta_t, tb_t = np.float32(0.5) * g, np.float32(-1.5) * g
    with fwAD.dual_level():
        dual = fn._native[0].apply(fwAD.make_dual(torch.tensor(a), torch.tensor(ta_t)),
                                   fwAD.make_dual(torch.tensor(b), torch.tensor(tb_t)))
        tangent = fwAD.unpack_dual(dual).tangent
    want = mod.jvp(ta_t, tb_t, saved)
    assert np.array_equal(tangent.numpy().view(np.uint32), want.view(np.uint32))


def test_double_backward_through_the_native_function():
    """The generated backward is torch code: autograd differentiates it (double backward), and
    it agrees with the eager path's registered double backward."""
    x = torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    e = st.expr("Max(x*x, x)", ties="split")
    for call in (e._native[0].apply, e):
        y = call(x)
        (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        if call is e:
            with pytest.raises(NotImplementedError):  # the eager CPU path refuses smooth parts
                torch.autograd.grad(g.sum(), x)
            continue
        (gg,) = torch.autograd.grad(g.sum(), x)
        # d/dx of (2x where x*x wins, 1 where x wins, (2x + 1)/2 at the tie x = 0): 2, 1 at 0
        assert gg.tolist() == [2.0, 1.0, 0.0, 2.0], gg


def test_other_devices_take_the_torch_module():
    """A tensor on a device other than the CPU runs the torch backend's module (here the meta
    device: shapes and dtypes only, as any accelerator's tensors reach it): no NumPy, no host."""
    relu = st.op("relu", ties="split")
    x = torch.empty(3, 4, device="meta", requires_grad=True)
    y = relu(x)
    assert y.device.type == "meta" and y.shape == (3, 4)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert g.device.type == "meta" and g.shape == (3, 4)
    h = st.Hardtanh(ties="split")(torch.empty(2, dtype=torch.bfloat16, device="meta"))
    assert h.dtype == torch.bfloat16 and h.device.type == "meta"


def test_an_op_wrapped_first_still_takes_the_torch_module():
    """symgrad.torch.wrap(module) makes an op without the torch backend's module; op() of the same
    module afterwards (one op per module) adds it, whatever ran first in the process."""
    wrapped = st.wrap(symgrad.load("relu", ties="last", nan="keep"))
    assert wrapped._native is None
    made = st.op("relu", ties="last", nan="keep")
    assert made is wrapped and made._native is not None
    x = torch.tensor([-1.0, 0.0, 2.0], device="meta")
    assert made(x).device.type == "meta"  # a device other than the CPU: the torch module


@pytest.mark.parametrize("kw", [{"ties": "first"}, {"ties": "split"}, {"convention": "jax"}])
def test_the_native_pooling_function_equals_numpy(kw):
    """Pooling's autograd.Function (eager form): forward, backward through autograd, forward-mode
    AD and double backward (backward is linear in grad_output: its derivative in grad_output is
    the backward again), against the NumPy module bit for bit, with ties and -inf."""
    fn = st.op("max_pool2d", kernel_size=3, stride=2, padding=1, **kw)
    mod = symgrad.load("max_pool2d", kernel_size=3, stride=2, padding=1, **kw)
    a = np.random.default_rng(0).choice([-np.inf, -1.0, 0.0, 1.0, 2.0], size=(2, 3, 7, 6)).astype(np.float32)
    x = torch.tensor(a, requires_grad=True)
    y = fn._native[0].apply(x)
    y_np, saved = mod.forward(a)
    assert np.array_equal(y.detach().numpy().view(np.uint32), y_np.view(np.uint32))
    g = np.linspace(-1, 1, y_np.size).astype(np.float32).reshape(y_np.shape)
    gt = torch.tensor(g, requires_grad=True)
    (gx,) = torch.autograd.grad(y, x, gt, create_graph=True)
    assert np.array_equal(gx.detach().numpy().view(np.uint32), mod.backward(g, saved)[0].view(np.uint32))
    (ggt,) = torch.autograd.grad(gx, gt, torch.ones_like(gx))  # d<backward(g), 1>/dg = jvp(1)
    assert np.array_equal(ggt.numpy().view(np.uint32), mod.jvp(np.ones_like(a), saved).view(np.uint32))
    import torch.autograd.forward_ad as fwAD
    t = np.float32(0.5) * a.clip(-3, 3)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(fn._native[0].apply(fwAD.make_dual(torch.tensor(a), torch.tensor(t)))).tangent
    assert np.array_equal(tangent.numpy().view(np.uint32), mod.jvp(t, saved).view(np.uint32))


def test_other_devices_take_the_torch_pooling_module():
    """Pooling and maxout on the meta device (as any accelerator's tensors reach them): the torch
    backend's module, shapes and dtypes through forward and backward."""
    x = torch.empty(2, 4, 7, 6, device="meta", requires_grad=True)
    for fn, shape in ((st.MaxPool2d(3, 2, 1, ties="split"), (2, 4, 4, 3)),
                      (st.op("maxout", pieces=2, convention="torch"), (2, 2, 7, 6))):
        y = fn(x)
        assert y.device.type == "meta" and tuple(y.shape) == shape
        (g,) = torch.autograd.grad(y.sum(), x)
        assert g.device.type == "meta" and g.shape == x.shape
    p, i = st.MaxPool2d(2, ties="first", return_indices=True)(x)
    assert i.device.type == "meta" and i.dtype == torch.int64 and i.shape == p.shape


@pytest.mark.parametrize("kw", [{"dim": -1, "ties": "split"}, {"dim": (0, 2), "keepdim": True, "ties": "first"},
                                {"convention": "jax"}])
def test_amax_compiles_fullgraph_and_equals_eager_and_numpy(kw):
    """amax through symgrad.torch under torch.compile(fullgraph=True) (the torch backend's module
    inside the autograd.Function): output and gradient equal eager's and the NumPy module's, bit
    for bit, with ties and zeros of both signs."""
    fn = st.op("amax", **kw)
    mod = symgrad.load("amax", **kw)
    a = np.random.default_rng(1).choice([-1.0, -0.0, 0.0, 2.0, 3.0], size=(3, 4, 5)).astype(np.float32)
    y_np, saved = mod.forward(a)
    g = np.linspace(-2, 2, y_np.size).astype(np.float32).reshape(y_np.shape)

    def step(x):
        y = fn(x)
        return y, torch.autograd.grad((y * torch.from_numpy(g)).sum(), x)[0]
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: fn(x), fullgraph=True)
    x = torch.tensor(a, requires_grad=True)
    y_c = compiled(x)
    (gx_c,) = torch.autograd.grad((y_c * torch.from_numpy(g)).sum(), x)
    y_e, gx_e = step(x)
    assert torch.equal(y_c, y_e) and torch.equal(gx_c, gx_e)
    want = mod.backward(g, saved)[0]
    assert np.array_equal(gx_c.numpy().view(np.uint32), want.view(np.uint32))
    if "index" in saved._fields:  # (split: np.max's sign of a zero output is its SIMD lanes')
        assert np.array_equal(y_c.detach().numpy().view(np.uint32), y_np.view(np.uint32))
    else:
        assert np.array_equal(y_c.detach().numpy(), y_np)


def test_other_devices_take_the_torch_reduction_module():
    """amax on the meta device (as any accelerator's tensors reach it): the torch backend's module."""
    x = torch.empty(2, 4, 5, device="meta", requires_grad=True)
    for fn, shape in ((st.op("amax", dim=-1, ties="split"), (2, 4)), (st.op("max", ties="first"), ())):
        y = fn(x)
        assert y.device.type == "meta" and tuple(y.shape) == shape
        (g,) = torch.autograd.grad(y.sum(), x)
        assert g.device.type == "meta" and g.shape == x.shape
