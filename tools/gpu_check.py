"""The torch and jax backends on a GPU against the NumPy modules on the CPU, bit for bit:

    python tools/gpu_check.py [--quick]

For every elementwise op x tie policy x NaN rule x argument order (a representative set with
--quick) and each preset, in float16, bfloat16, float32 and float64: the torch module on CUDA
tensors (under torch.use_deterministic_algorithms(True)) and the jax module on JAX's GPU device,
forward, backward and jvp, against the NumPy module on the CPU; then symgrad.torch's op on CUDA
tensors (autograd) and under torch.compile (Inductor's GPU code).  With CuPy, the CUDA backend's
segment ops (scatter_max/min, segment_max/min, segment_max_csr/min_csr) under every policy and
preset on tie-heavy inputs (NaN, +-inf, +-0, empty segments): forward, backward and jvp run twice
give identical bits and equal the NumPy backend (--cpu: the CUDA kernels through the CPU harness of
tests/cuda_harness); beside it, torch_scatter's CUDA scatter_max run twice where it installs.
Prints one line per group with
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


# the CUDA backend's segment ops: (op, parameters), each under every policy and preset
SEGMENTS = [("scatter_max", {"dim": 0, "include_self": False}), ("scatter_min", {"dim": 1, "include_self": True}),
            ("segment_max", {"num_segments": 300}), ("segment_min", {"num_segments": 300}),
            ("segment_max_csr", {}), ("segment_min_csr", {})]
SEGMENT_POLICIES = [{"ties": t} for t in ("first", "last", "split", "all")] + [
    {"convention": "torch"}, {"convention": "jax"}]


def _cupy(cpu: bool):
    """CuPy with a GPU, the CPU harness's stand-in (--cpu), or None."""
    if cpu:
        import tempfile
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import cuda_harness
        sys.modules["cupy"] = cuda_harness.fake_cupy(Path(tempfile.mkdtemp(prefix="gpu-check-")))
        return sys.modules["cupy"]
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception as exc:  # noqa: BLE001 - no CuPy or no device: say so
        print(f"cuda backend: not checked ({type(exc).__name__}: {exc})")
        return None


def segment_inputs(op: str, params: dict, dtype, rng) -> list:
    """Tie-heavy inputs (NaN, +-inf, +-0, a few values) of 4096 rows of 8 features into 300
    segments, some of them empty."""
    def ties(shape):
        values = np.array([0.0, -0.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan, 3.0])
        return rng.choice(values, shape).astype(dtype)
    if op.startswith("scatter"):
        shape, out = [8, 8], [8, 8]
        shape[params["dim"]], out[params["dim"]] = 4096, 300
        return [ties(tuple(out)), rng.integers(0, 290, tuple(shape)), ties(tuple(shape))]
    if op.endswith("csr"):
        return [ties((4096, 8)), np.sort(np.concatenate([[0, 4096], rng.integers(0, 4097, 299)]))]
    return [ties((4096, 8)), rng.integers(0, 290, 4096)]


def _segment_run(cp, module, xs, g, ts) -> list:
    """forward, backward and jvp of the CUDA module, on the host."""
    host = getattr(cp, "asnumpy", np.asarray)
    y, saved = module.forward(*[cp.asarray(x) for x in xs])
    grads = [a for a in module.backward(cp.asarray(g), saved) if a is not None]
    tangent = module.jvp(*[None if t is None else cp.asarray(t) for t in ts], saved)
    return [host(a) for a in (y, *grads, tangent)]


def check_segments(args, record) -> None:
    """The CUDA backend's segments: run twice, identical bits, equal to the NumPy backend."""
    cp = _cupy(args.cpu)
    if cp is None:
        return
    rng = np.random.default_rng(1)
    for (op, params), kw in itertools.product(SEGMENTS, SEGMENT_POLICIES):
        if args.quick and kw.get("ties") in ("last", "all"):
            continue
        np_mod, cu_mod = symgrad.load(op, **params, **kw), symgrad.load(op, backend="cuda", **params, **kw)
        for dtype in (np.float16, np.float32, np.float64):
            if dtype == np.float16 and cu_mod.FLOAT16_REFUSED:
                continue  # JAX's 1 / count, rounded to float16 in NumPy: the CUDA module refuses it
            xs = segment_inputs(op, params, dtype, rng)
            y, s = np_mod.forward(*xs)
            g = rng.choice(np.array([1.0, -3.0, 0.5, -0.0, 7.0]), y.shape).astype(dtype)
            ts = [None if x.dtype.kind in "iu" else rng.standard_normal(x.shape).astype(dtype) for x in xs]
            want = [y, *[a for a in np_mod.backward(g, s) if a is not None], np_mod.jvp(*ts, s)]
            first, second = _segment_run(cp, cu_mod, xs, g, ts), _segment_run(cp, cu_mod, xs, g, ts)
            ok = len(first) == len(want) and all(same(a, b) for a, b in zip(first, want))
            ok &= all(same(a, b) for a, b in zip(first, second))
            record(f"cuda backend segments{' (CPU harness)' if args.cpu else ''}, {np.dtype(dtype).name}",
                   ok, f"{op} {params} {kw}")
    if not args.cpu:
        _torch_scatter_runs(rng)


def _torch_scatter_runs(rng) -> None:
    """torch_scatter's CUDA scatter_max on tied values (1M rows of 64 into 50k segments) run twice:
    how many argmax (the element its gradient goes to) change from run to run."""
    try:
        import torch
        import torch_scatter
    except ImportError as exc:
        print(f"torch_scatter: not compared ({exc})")
        return
    src = torch.ones(1 << 20, 64, device="cuda")
    index = torch.from_numpy(rng.integers(0, 50_000, 1 << 20)).cuda()
    argmax = [torch_scatter.scatter_max(src, index, dim=0, dim_size=50_000)[1] for _ in range(2)]
    print(f"torch_scatter scatter_max on CUDA, all values tied, run twice: "
          f"{int((argmax[0] != argmax[1]).sum())} of {argmax[0].numel()} argmax differ")


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
    check_segments(args, record)
    for group, (n, bad) in results.items():
        print(f"{group}: {n} variants, {bad} differ")
    for line in failures:
        print("differs:", line)
    if not results:
        print("nothing checked: no CUDA device for torch, no GPU for jax")
    return 1 if any(bad for _, bad in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
