"""roi_max_pool (issue 33, item 3): torchvision.ops.roi_pool's CPU kernel as a brute-force loop
written here from its C++ source (torchvision/csrc/ops/cpu/roi_pool_kernel.cpp: torchvision 0.28
would not load beside the CPU-only torch 2.13 here, its wheel links libc10_cuda), against the
torch preset bit for bit (float32/64; tie-heavy, NaN, +-inf, +-0, -FLT_MAX, overlapping and empty
bins, boxes outside the input); every policy against a loop from the README's definition (a bin's
output is the max of its elements, W's row the policy's weights over it, an element's gradient
added over the bins holding it); symgrad.check; bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import symgrad
from conftest import assert_same_values
from test_bag import _row_weights, _same_bits, _times

OP = "roi_max_pool"
FLT_MAX = float(np.finfo(np.float32).max)
VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan, -FLT_MAX]


def _c_round(v) -> int:
    """C's round(): half away from zero."""
    a = abs(float(v))
    whole = math.floor(a)
    return int(math.copysign(whole + (1 if a - whole >= 0.5 else 0), float(v)))


def _bins(box, scale, ph_n, pw_n, height, width, T):
    """torchvision's bins of one box, in (ph, pw) order: (batch index, rows, columns)."""
    r = [T(v) for v in box]
    x1, y1, x2, y2 = (_c_round(r[i] * T(scale)) for i in range(1, 5))
    roi_w, roi_h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
    bin_h, bin_w = T(roi_h) / T(ph_n), T(roi_w) / T(pw_n)
    out = []
    for ph in range(ph_n):
        for pw in range(pw_n):
            hs = min(max(int(math.floor(T(ph) * bin_h)) + y1, 0), height)
            he = min(max(int(math.ceil(T(ph + 1) * bin_h)) + y1, 0), height)
            ws = min(max(int(math.floor(T(pw) * bin_w)) + x1, 0), width)
            we = min(max(int(math.ceil(T(pw + 1) * bin_w)) + x1, 0), width)
            out.append((int(r[0]), range(hs, he), range(ws, we)))
    return out


def _torchvision(x, boxes, size, scale, g):
    """roi_pool_forward_kernel_impl and roi_pool_backward_kernel_impl, loop for loop."""
    T = x.dtype.type
    k_n, (c_n, h_n, w_n), (ph_n, pw_n) = boxes.shape[0], x.shape[1:], size
    out = np.zeros((k_n, c_n, ph_n, pw_n), dtype=x.dtype)
    argmax = np.full(out.shape, -1)
    for k in range(k_n):
        for i, (b, hs, ws) in enumerate(_bins(boxes[k], scale, ph_n, pw_n, h_n, w_n, T)):
            for c in range(c_n):
                best = T(0) if not (hs and ws) else T(-FLT_MAX)
                for h in hs:
                    for w in ws:
                        if x[b, c, h, w] > best:
                            best, argmax[k, c, i // pw_n, i % pw_n] = x[b, c, h, w], h * w_n + w
                out[k, c, i // pw_n, i % pw_n] = best
    grad = np.zeros_like(x)
    for k in range(k_n):
        b = int(T(boxes[k, 0]))
        for c in range(c_n):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    if argmax[k, c, ph, pw] != -1:
                        grad[b, c].reshape(-1)[argmax[k, c, ph, pw]] += g[k, c, ph, pw]
    return out, grad


def _definition(x, boxes, size, scale, g, ties, nan):
    """Each bin's output and W-row by the definition; the gradient added over the bins holding an
    element, in bin order."""
    T = x.dtype.type
    k_n, (c_n, h_n, w_n), (ph_n, pw_n) = boxes.shape[0], x.shape[1:], size
    out = np.zeros((k_n, c_n, ph_n, pw_n), dtype=x.dtype)
    grad = np.zeros_like(x)
    for c in range(c_n):
        for k in range(k_n):
            for i, (b, hs, ws) in enumerate(_bins(boxes[k], scale, ph_n, pw_n, h_n, w_n, T)):
                members = [(h, w) for h in hs for w in ws]
                if not members:
                    continue
                w_row, out[k, c, i // pw_n, i % pw_n] = _row_weights([x[b, c, h, w] for h, w in members], ties, nan)
                for (h, w), wi in zip(members, w_row):
                    if wi != 0:
                        grad[b, c, h, w] += _times(wi, g[k, c, i // pw_n, i % pw_n])
    return out, grad


def _case(rng, dtype, n=2, c=2, h=5, w=6, k=4):
    x = np.array(rng.choice(VALUES, size=(n, c, h, w)), dtype=dtype)
    corners = rng.choice(np.arange(-3.0, 9.0, 0.5), size=(k, 4))
    boxes = np.concatenate([rng.integers(0, n, size=(k, 1)).astype(float), corners], axis=1).astype(dtype)
    return x, boxes


@pytest.mark.parametrize("dtype,size,scale", [(np.float32, (2, 3), 1.0), (np.float64, (3, 2), 0.5),
                                              pytest.param(np.float32, (4, 4), 0.75, marks=pytest.mark.slow),
                                              pytest.param(np.float64, (1, 5), 1.0, marks=pytest.mark.slow)])
def test_torch_preset_is_torchvisions_cpu_kernel_bit_for_bit(dtype, size, scale):
    mod = symgrad.load(OP, convention="torch", output_size=size, spatial_scale=scale)
    rng = np.random.default_rng(23)
    for case in range(4):
        x, boxes = _case(rng, dtype)
        g = np.array(rng.choice([1.0, -2.5, 0.5, 3.0, -0.0], size=(boxes.shape[0], x.shape[1]) + size), dtype=dtype)
        want_out, want_grad = _torchvision(x, boxes, size, scale, g)
        out, saved = mod.forward(x, boxes)
        _same_bits(out, want_out, f"output, case {case}")
        _same_bits(mod.backward(g, saved)[0], want_grad, f"grad_input, case {case}")


SETTINGS = [("first", "dominate"), ("split", "dominate"), ("last", "keep"),
            pytest.param("all", "zero", marks=pytest.mark.slow),
            pytest.param("last", "dominate", marks=pytest.mark.slow),
            pytest.param("split", "nan", marks=pytest.mark.slow)]


@pytest.mark.parametrize("ties,nan", SETTINGS)
def test_every_policy_against_the_definition(ties, nan):
    mod = symgrad.load(OP, ties=ties, nan=nan, output_size=(2, 3))
    rng = np.random.default_rng(29)
    for case in range(3):
        x, boxes = _case(rng, np.float64)
        g = rng.normal(size=(boxes.shape[0], x.shape[1], 2, 3))
        want_out, want_grad = _definition(x, boxes, (2, 3), 1.0, g, ties, nan)
        out, saved = mod.forward(x, boxes)
        assert_same_values(out, want_out, f"{ties}/{nan} output, case {case}")
        assert_same_values(mod.backward(g, saved)[0], want_grad, f"{ties}/{nan} grad", zeros=False)


def test_symgrad_check_decides_bins():
    mod = symgrad.load(OP, ties="split", output_size=2)
    x = np.array([[[[1.0, 1.0, 0.0], [2.0, 0.5, 2.0], [0.0, 3.0, 3.0]]]])
    report = symgrad.check(mod, x, np.array([[0.0, 0.0, 0.0, 2.0, 2.0]]))
    assert report and report.tied_windows == 1, str(report)  # bin (1, 1): 3 and 3
    assert not symgrad.check(mod, x, np.array([[0.0, 0.0, 0.0, 2.0, 2.0]]), ties="first")


def test_bad_input_is_one_line():
    mod = symgrad.load(OP, output_size=2)
    for x, boxes, match in ((np.zeros((1, 1, 3)), np.zeros((1, 5)), "expected input"),
                            (np.zeros((1, 1, 3, 3)), np.zeros((1, 4)), "expected input"),
                            (np.zeros((1, 1, 3, 3)), np.array([[1.0, 0, 0, 1, 1]]), r"batch indices must be in \[0, 1\)"),
                            (np.zeros((1, 1, 3, 3)), np.array([[0.0, 0, np.nan, 1, 1]]), "finite")):
        with pytest.raises(ValueError, match=match):
            mod.forward(x, boxes)
    with pytest.raises(TypeError, match="output_size"):
        symgrad.load(OP)


def test_symgrad_torch_roipool_is_torchvisions_rule():
    torch = pytest.importorskip("torch")
    import symgrad.torch as st
    rng = np.random.default_rng(31)
    x, boxes = _case(rng, np.float32)
    g = np.array(rng.normal(size=(boxes.shape[0], x.shape[1], 2, 2)), dtype=np.float32)
    want_out, want_grad = _torchvision(x, boxes, (2, 2), 0.5, g)
    xt = torch.tensor(x, requires_grad=True)
    y = st.RoIPool(2, 0.5, convention="torch")(xt, torch.tensor(boxes))
    y.backward(torch.tensor(g))
    _same_bits(y.detach().numpy(), want_out, "output")
    _same_bits(xt.grad.numpy(), want_grad, "grad_input")
    with pytest.raises(TypeError, match="rois must be a"):
        st.RoIPool(2, 1.0)(xt, [boxes])
