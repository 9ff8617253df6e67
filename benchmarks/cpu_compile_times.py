"""Compile time on first use and load time from the cache, per op of each kind (cpu backend):
one library per kind and policy form (scan, mask) compiled into an empty cache, then loaded again
as a new process would (python benchmarks/cpu_compile_times.py)."""
import os, sys, tempfile, time
_CACHE = tempfile.TemporaryDirectory(prefix="sg-cpu-times-")  # removed when the process exits
os.environ["SYMGRAD_CACHE_DIR"] = _CACHE.name
import symgrad
CASES = [("relu", {}, {}), ("maximum", {}, {}), ("clamp", {"min": -1.0, "max": 1.0}, {}),
         ("expr Max(x*y, x + y, 0)", None, {}),
         ("amax", {"dim": 1}, {"ties": "first"}), ("amax", {"dim": 1}, {"ties": "split"}),
         ("maxout", {"pieces": 3}, {"ties": "first"}), ("maxout", {"pieces": 3}, {"ties": "split"}),
         ("max_unpool2d", {"kernel_size": 2}, {"ties": "last"}), ("max_unpool2d", {"kernel_size": 2}, {"ties": "all"}),
         ("adaptive_max_pool2d", {"output_size": (3, 4)}, {"ties": "first"}),
         ("adaptive_max_pool2d", {"output_size": (3, 4)}, {"ties": "split"}),
         ("fractional_max_pool2d", {"kernel_size": 3, "output_size": (4, 5)}, {"ties": "first"}),
         ("fractional_max_pool2d", {"kernel_size": 3, "output_size": (4, 5)}, {"ties": "split"}),
         ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, {"ties": "first"})]
for op, params, settings in CASES:
    m = (symgrad.load_expr("Max(x*y, x + y, 0)", backend="cpu") if params is None
         else symgrad.load(op, backend="cpu", **settings, **params))
    t = time.perf_counter(); m.library(); first = time.perf_counter() - t
    m._library = None
    t = time.perf_counter(); m.library(); cached = time.perf_counter() - t
    print(f"{op:28s} {str(params or ''):28s} {str(settings):18s} compile {first:6.2f} s   from cache {cached * 1000:6.1f} ms", flush=True)
