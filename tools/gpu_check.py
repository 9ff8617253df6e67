"""The torch and jax backends on a GPU against the NumPy modules on the CPU, bit for bit:

    python tools/gpu_check.py [--quick]

For every elementwise op x tie policy x NaN rule x argument order (a representative set with
--quick) and each preset, in float16, bfloat16, float32 and float64: the torch module on CUDA
tensors (under torch.use_deterministic_algorithms(True)) and the jax module on JAX's GPU device,
forward, backward and jvp, against the NumPy module on the CPU; then symgrad.torch's op on CUDA
tensors (autograd) and under torch.compile (Inductor's GPU code).  Prints one line per group with
the number of variants and mismatches (bit patterns; NaNs compared as NaN), and the first few
mismatches.  Exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import symgrad  # noqa: E402
from symgrad import policy  # noqa: E402
from symgrad.ops import resolve  # noqa: E402

OPS = {"relu": {}, "abs": {}, "relu6": {}, "maximum": {}, "minimum": {}, "hardtanh": {},
       "clamp": {"min": -1.0, "max": 1.0}, "leaky_relu": {"negative_slope": 0.3}}
SPECIAL = [0.0, -0.0, 1.0, -1.0, 6.0, -6.0, 0.5, -0.5, 2.0, -2.0, np.inf, -np.inf, np.nan, 0.01,
           -0.01, 3.0, 1e-3, 65504.0, 1e-8]


def variants(quick: bool):
    for name in OPS:
        yield name, {"convention": "torch"}
        yield name, {"convention": "jax"}
        combos = itertools.product(policy.TIES, policy.NAN_RULES, ("given", "reversed"))
        for i, (ties, nan, order) in enumerate(combos):
            if quick and i % 7:
                continue
            try:
                resolve(name, ties, nan=nan, order=order, **OPS[name])
            except ValueError:
                continue
            yield name, {"ties": ties, "nan": nan, "order": order}


def inputs(n: int, dtype, rng) -> list[np.ndarray]:
    vals = np.array(SPECIAL)
    if n == 1:
        x = np.concatenate([vals, rng.standard_normal(4096) * 3])
        return [x.astype(dtype)]
    pairs = np.array(list(itertools.product(vals, vals)))
    a = np.concatenate([pairs[:, 0], rng.standard_normal(4096) * 3])
    b = np.concatenate([pairs[:, 1], a[len(pairs):len(pairs) + 2048], rng.standard_normal(2048)])
    return [a.astype(dtype), b.astype(dtype)]


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    out = a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]).copy()
    out[np.isnan(a.astype(np.float64))] = 0
    return out


def same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.array_equal(bits(got), bits(want)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="run the same comparisons on the CPU (checks the script)")
    args = ap.parse_args()
    import ml_dtypes
    dtypes = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
              "float64": np.float64}
    results, failures = {}, []

    def record(group, ok, what):
        n, bad = results.get(group, (0, 0))
        results[group] = (n + 1, bad + (not ok))
        if not ok and len(failures) < 12:
            failures.append(f"{group}: {what}")

    try:
        import torch
        have_torch = args.cpu or torch.cuda.is_available()
    except ImportError:
        have_torch = False
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        gpus = jax.devices("cpu") if args.cpu else [d for d in jax.devices() if d.platform == "gpu"]
    except Exception as exc:  # noqa: BLE001 - no JAX or no GPU plugin: say so
        print(f"jax: not checked ({type(exc).__name__}: {exc})")
        gpus = []
    device = "cpu" if args.cpu else "cuda"
    print(f"torch: {device if not args.cpu else 'cpu (--cpu)'} "
          f"{torch.cuda.get_device_name() if have_torch and not args.cpu else ''}; jax devices: {gpus}")
    if have_torch:
        torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(0)
    for name, kw in variants(args.quick):
        np_mod = symgrad.load(name, **OPS[name], **kw)
        th_mod = symgrad.load(name, backend="torch", **OPS[name], **kw) if have_torch else None
        jx_mod = symgrad.load(name, backend="jax", **OPS[name], **kw) if gpus else None
        for dname, dtype in dtypes.items():
            xs = inputs(len(np_mod.INPUTS), dtype, rng)
            y, s = np_mod.forward(*xs)
            g = rng.standard_normal(y.shape).astype(dtype)
            grads = np_mod.backward(g, s)
            ts = [rng.standard_normal(x.shape).astype(dtype) for x in xs]
            tan = np_mod.jvp(*ts, s)
            label = f"{name} {kw} {dname}"
            if th_mod is not None:
                def cuda(a):
                    if a.dtype == dtypes["bfloat16"]:
                        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
                    return torch.from_numpy(a).to(device)

                def host(t):
                    t = t.detach().cpu().contiguous()
                    return t.view(torch.int16).numpy().view(dtypes["bfloat16"]) if t.dtype == torch.bfloat16 else t.numpy()
                ty, tsv = th_mod.forward(*map(cuda, xs))
                ok = same(host(ty), y)
                tg = th_mod.backward(cuda(g), tsv)
                ok &= all(same(host(a), b) for a, b in zip(tg, grads) if b is not None)
                ok &= same(host(th_mod.jvp(*map(cuda, ts), tsv)), tan)
                record(f"torch backend on {device}, {dname}", ok, label)
            if jx_mod is not None:
                import jax.numpy as jnp
                dev = gpus[0]
                jxs = [jax.device_put(jnp.asarray(x), dev) for x in xs]
                jy, jsv = jx_mod.forward(*jxs)
                ok = same(np.asarray(jy), y)
                jg = jx_mod.backward(jax.device_put(jnp.asarray(g), dev), jsv)
                ok &= all(same(np.asarray(a), b) for a, b in zip(jg, grads) if b is not None)
                ok &= same(np.asarray(jx_mod.jvp(*[jax.device_put(jnp.asarray(t), dev) for t in ts], jsv)), tan)
                record(f"jax backend on {gpus[0].platform}, {dname}", ok, label)
    if have_torch:  # symgrad.torch's native path: autograd on CUDA tensors, and torch.compile
        import symgrad.torch as st
        for name, kw in [("relu", {"ties": "split"}), ("maximum", {"convention": "torch"}),
                         ("hardtanh", {"ties": "first"}), ("clamp", {"ties": "split"})]:
            np_mod = symgrad.load(name, **OPS[name], **kw)
            f = st.op(name, **OPS[name], **kw)
            xs = inputs(len(np_mod.INPUTS), np.float32, rng)
            y, s = np_mod.forward(*xs)
            g = rng.standard_normal(y.shape).astype(np.float32)
            want = np_mod.backward(g, s)
            for mode, fn in (("eager", f), ("torch.compile", torch.compile(f, fullgraph=True))):
                ts = [torch.from_numpy(x).to(device).requires_grad_(True) for x in xs]
                out = fn(*ts)
                out.backward(torch.from_numpy(g).to(device))
                ok = same(out.detach().cpu().numpy(), y)
                ok &= all(same(t.grad.cpu().numpy(), w) for t, w in zip(ts, want) if w is not None)
                record(f"symgrad.torch on {device}, {mode}, float32", ok, f"{name} {kw}")
    for group, (n, bad) in results.items():
        print(f"{group}: {n} variants, {bad} differ")
    for line in failures:
        print("differs:", line)
    if not results:
        print("nothing checked: no CUDA device for torch, no GPU for jax")
    return 1 if any(bad for _, bad in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
