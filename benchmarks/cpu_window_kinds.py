"""Forward and backward of the cpu backend's window kinds on the select skeleton (adaptive pooling,
maxout, a reduction, fractional pooling; a scan and a mask policy each), float32 and float16, on
one OpenMP thread: the CPU time of the calling thread (time.thread_time, so a machine shared with
other work slows it little), best of R runs (python benchmarks/cpu_window_kinds.py [case ...])."""
import os, sys, tempfile, time
_CACHE = tempfile.TemporaryDirectory(prefix="sg-cpu-kinds-")  # removed when the process exits
os.environ.setdefault("SYMGRAD_CACHE_DIR", _CACHE.name)
import numpy as np
import symgrad

CASES = [
    ("adaptive_max_pool2d", {"output_size": (7, 7)}, {"ties": "first"}, (8, 64, 28, 28)),
    ("adaptive_max_pool2d", {"output_size": (7, 7)}, {"ties": "split"}, (8, 64, 28, 28)),
    ("maxout", {"pieces": 4}, {"ties": "first"}, (32, 256, 16, 16)),
    ("maxout", {"pieces": 4}, {"ties": "split"}, (32, 256, 16, 16)),
    ("amax", {"dim": 1}, {"ties": "first"}, (1024, 1024)),
    ("amax", {"dim": 1}, {"ties": "split"}, (1024, 1024)),
    ("fractional_max_pool2d", {"kernel_size": 3, "output_size": (20, 20)}, {"ties": "first"}, (8, 64, 48, 48)),
    ("fractional_max_pool2d", {"kernel_size": 3, "output_size": (20, 20)}, {"ties": "split"}, (8, 64, 48, 48)),
]
R = int(os.environ.get("R", "10"))
for case in map(int, sys.argv[1:] or range(len(CASES))):
    op, params, settings, shape = CASES[case]
    rng = np.random.default_rng(0)
    m = symgrad.load(op, backend="cpu", **settings, **params)
    m.library()
    for dtype in (np.float32, np.float16):
        x = rng.standard_normal(shape).astype(dtype)
        # fractional pooling's samples in [0, 1) (0.99 * [0, 1): float16 rounding stays below 1)
        args = ((x, (0.99 * rng.random(shape[:2] + (2,))).astype(dtype)) if op.startswith("fractional")
                else (x,))
        out, saved = m.forward(*args, threads=1)
        g = rng.standard_normal(out.shape).astype(dtype)
        f = b = float("inf")
        for _ in range(R):
            t = time.thread_time(); out, saved = m.forward(*args, threads=1); f = min(f, time.thread_time() - t)
            t = time.thread_time(); m.backward(g, saved, threads=1); b = min(b, time.thread_time() - t)
        print(f"{op:22s} {settings['ties']:6s} {np.dtype(dtype).name:8s} forward {f * 1e3:7.2f} ms  "
              f"backward {b * 1e3:7.2f} ms", flush=True)
