"""One training step of a small CNN with symgrad's ops against the same model with the frameworks'
own ops: PyTorch eager, torch.compile and jax.jit, side by side in one process.

    python benchmarks/frameworks.py                       # both models, every contender
    python benchmarks/frameworks.py --model cnn --rounds 11 --only torch-eager,jax-jit
    python benchmarks/frameworks.py --ties split,torch,jax
    python benchmarks/frameworks.py --model digits --only torch-eager --processes 5

Models (float32, batch 64, random data of the models' input shape; the step's cost does not
depend on the values):
  cnn     3x64x64: conv3x3 32 -> relu -> maxpool 2 -> conv3x3 64 -> relu -> maxpool 2
          -> adaptive max pool 1 -> linear 10
  digits  1x8x8 (sklearn's digits): conv3x3 16 -> relu -> maxpool 2 -> linear 10 (overhead-bound)
A step: forward, cross-entropy loss, backward, SGD update of every parameter.

Contenders, for each model: the framework's own relu and max pooling ("native") and symgrad's
(symgrad.torch's ReLU/MaxPool2d/AdaptiveMaxPool2d modules; symgrad.jax.op) under each tie setting
of --ties (a policy, or a preset: torch, jax), in
  torch-eager    the step as written;
  torch-compile  torch.compile of the model (forward and its backward graph; the SGD update eager);
  jax-jit        jax.jit of the whole step (value_and_grad and the update).
Every time is the median of --rounds interleaved rounds (each round runs every contender once, in an
order shuffled afresh each round) after --warmup rounds, all in this one process, on one thread for
both frameworks by default (--threads: torch.set_num_threads and XLA's CPU flags, set before JAX
starts), on the wall clock or (--clock cpu) in process CPU time (fairer on a loaded machine).
The ratio is symgrad's step over the native step of the same framework and mode.  On a shared
machine a step's time also moves from one process to the next (the native digits step took 1.03 to
1.69 ms in four processes of one idle half hour), as much as a ratio's margin: --processes N runs
the whole measurement in N fresh processes, one after another, and prints each process's ratios
and their median.  Prints a table and asserts nothing; which path each symgrad op took (the
framework backend's generated code, or a compiled C kernel / host callback) is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's symgrad
_CACHE = tempfile.TemporaryDirectory(prefix="symgrad-bench-")  # removed when the process exits
os.environ.setdefault("SYMGRAD_CACHE_DIR", _CACHE.name)

MODELS = {  # name: (input shape without the batch, channels of each conv, adaptive pool at the end)
    "cnn": ((3, 64, 64), (32, 64), True),
    "digits": ((1, 8, 8), (16,), False),
}
MODES = ("torch-eager", "torch-compile", "jax-jit")
CLASSES = 10
LR = 0.01


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn,digits", help="comma-separated: cnn, digits")
    ap.add_argument("--only", default=",".join(MODES), help="comma-separated modes: " + ", ".join(MODES))
    ap.add_argument("--ties", default="split,torch,jax",
                    help="comma-separated symgrad settings: a policy (first, last, split, all) or a "
                         "preset (torch, jax)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: time.perf_counter; cpu: process CPU time (time.process_time), the fairer "
                         "figure on a loaded machine with --threads 1")
    ap.add_argument("--processes", type=int, default=1,
                    help="run the measurement in this many fresh processes, one after another, and "
                         "print the median of their ratios")
    args = ap.parse_args()
    if args.processes < 1:
        ap.error(f"--processes: expected a positive count, got {args.processes}")
    for name, allowed, given in (("--model", MODELS, args.model), ("--only", MODES, args.only)):
        wrong = [v for v in given.split(",") if v not in allowed]
        if wrong:
            ap.error(f"{name}: unknown {', '.join(wrong)}; expected some of {', '.join(allowed)}")
    return args


def _setting(tie: str) -> dict:
    return {"convention": tie} if tie in ("torch", "jax") else {"ties": tie}


# ----------------------------------------------------------------------------- PyTorch

def _torch_model(model: str, relu, pool, adaptive):
    import torch
    shape, channels, has_adaptive = MODELS[model]
    layers, c_in, side = [], shape[0], shape[1]
    for c in channels:
        layers += [torch.nn.Conv2d(c_in, c, 3, padding=1), relu(), pool(2)]
        c_in, side = c, side // 2
    if has_adaptive:
        layers += [adaptive(1)]
        side = 1
    layers += [torch.nn.Flatten(), torch.nn.Linear(c_in * side * side, CLASSES)]
    torch.manual_seed(0)
    return torch.nn.Sequential(*layers)


def _torch_steps(model: str, ties: list[str], batch: int, modes: set) -> dict:
    import torch

    import symgrad.torch as st
    shape = MODELS[model][0]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((batch, *shape), generator=gen)
    y = torch.randint(0, CLASSES, (batch,), generator=gen)
    kinds = {"native": (torch.nn.ReLU, torch.nn.MaxPool2d, torch.nn.AdaptiveMaxPool2d)}
    for tie in ties:
        s = _setting(tie)
        kinds[f"symgrad {tie}"] = (lambda s=s: st.ReLU(**s), lambda k, s=s: st.MaxPool2d(k, **s),
                                   lambda n, s=s: st.AdaptiveMaxPool2d(n, **s))
    steps = {}
    for mode in ("torch-eager", "torch-compile"):
        if mode not in modes:
            continue
        for kind, (relu, pool, adaptive) in kinds.items():
            net = _torch_model(model, relu, pool, adaptive)
            run = torch.compile(net) if mode == "torch-compile" else net
            steps[(mode, kind)] = _torch_step(net, run, x, y)
    return steps


def _torch_step(net, run, x, y):
    import torch
    params = list(net.parameters())

    def step():
        for p in params:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(run(x), y)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.sub_(LR * p.grad)
    return step


# ----------------------------------------------------------------------------- JAX

def _jax_steps(model: str, ties: list[str], batch: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import symgrad.jax as sj
    shape, channels, has_adaptive = MODELS[model]
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((batch, *shape), dtype=np.float32))
    y = jnp.asarray(rng.integers(0, CLASSES, batch))

    def native_pool(v):
        return jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def native_adaptive(v):  # output size 1: the max over the whole plane
        return jnp.max(v, axis=(2, 3), keepdims=True)

    kinds = {"native": (jax.nn.relu, native_pool, native_adaptive)}
    for tie in ties:
        s = _setting(tie)
        kinds[f"symgrad {tie}"] = (sj.op("relu", **s), sj.op("max_pool2d", kernel_size=2, **s),
                                   sj.op("adaptive_max_pool2d", output_size=1, **s))
    params = _jax_params(shape, channels, has_adaptive)
    steps, paths = {}, {}
    for kind, (relu, pool, adaptive) in kinds.items():
        steps[("jax-jit", kind)] = _jax_step(relu, pool, adaptive if has_adaptive else None, params, x, y)
        used = (relu, pool, adaptive) if has_adaptive else (relu, pool)
        paths[kind] = "jax.nn, lax" if kind == "native" else _jax_paths(*used)
    return steps, paths


def _jax_params(shape, channels, has_adaptive):
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(0)
    params, c_in, side = [], shape[0], shape[1]
    for c in channels:
        bound = 1 / np.sqrt(c_in * 9)
        params.append((jnp.asarray(rng.uniform(-bound, bound, (c, c_in, 3, 3)).astype(np.float32)),
                       jnp.asarray(rng.uniform(-bound, bound, c).astype(np.float32))))
        c_in, side = c, side // 2
    features = c_in * (1 if has_adaptive else side * side)
    bound = 1 / np.sqrt(features)
    params.append((jnp.asarray(rng.uniform(-bound, bound, (features, CLASSES)).astype(np.float32)),
                   jnp.asarray(rng.uniform(-bound, bound, CLASSES).astype(np.float32))))
    return params


def _jax_step(relu, pool, adaptive, params, x, y):
    import jax
    import jax.numpy as jnp

    def loss(ps):
        v = x
        for w, b in ps[:-1]:
            v = jax.lax.conv_general_dilated(v, w, (1, 1), ((1, 1), (1, 1)),
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"))
            v = pool(relu(v + b[None, :, None, None]))
        if adaptive is not None:
            v = adaptive(v)
        w, b = ps[-1]
        logits = v.reshape(v.shape[0], -1) @ w + b
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])

    @jax.jit
    def update(ps):
        value, grads = jax.value_and_grad(loss)(ps)
        return value, jax.tree_util.tree_map(lambda p, g: p - LR * g, ps, grads)

    state = {"params": params}

    def step():
        value, state["params"] = update(state["params"])
        jax.block_until_ready(value)
    return step


def _jax_paths(*ops) -> str:
    """How symgrad.jax runs each op: traced in place (the jax backend's code) or a host callback."""
    return ", ".join(f"{o.op}: {'jax backend' if type(o).__name__ == '_Native' else 'host callback'}"
                     for o in ops)


# ----------------------------------------------------------------------------- timing

def _time(steps: dict, rounds: int, warmup: int, clock=time.perf_counter) -> dict:
    for step in steps.values():  # compile and warm up
        for _ in range(warmup):
            step()
    samples = {key: [] for key in steps}
    order = list(steps)
    shuffle = random.Random(0)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for key in order:
            t0 = clock()
            steps[key]()
            samples[key].append(clock() - t0)
    return {key: statistics.median(s) for key, s in samples.items()}


_ROW = re.compile(r"^  (\S+)\s+(native|symgrad \S+)\s+([\d.]+)\s+([\d.]+)  ")


def _across_processes(args) -> int:
    """The measurement in args.processes fresh processes: each one's table, then each row's ratios
    and their median."""
    ratios: dict = {}
    for k in range(args.processes):
        # the same arguments, the last --processes 1 overriding the first (argparse: the last wins)
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--processes", "1"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            sys.exit(f"benchmarks/frameworks.py: process {k + 1} failed: {last}")
        print(f"--- process {k + 1} of {args.processes}\n{out.stdout.rstrip()}", flush=True)
        model = None
        for line in out.stdout.splitlines():
            if line.startswith("model "):
                model = line.split()[1]
            m = _ROW.match(line)
            if m and m[2] != "native":
                ratios.setdefault((model, m[1], m[2]), []).append(float(m[4]))
    print(f"\nratios to the native step in each of {args.processes} processes, and their median")
    for (model, mode, kind), rs in ratios.items():
        each = " ".join(f"{r:.2f}" for r in rs)
        print(f"  {model:7s} {mode:14s} {kind:16s} {each}   median {statistics.median(rs):.2f}")
    return 0


def main() -> int:
    args = _parse()
    if args.processes > 1:
        return _across_processes(args)
    modes = set(args.only.split(","))
    ties = args.ties.split(",")
    if "jax-jit" in modes and args.threads == 1:  # before JAX starts: one thread, as torch below
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                                   " intra_op_parallelism_threads=1").strip()
    try:
        import torch
    except ImportError:
        if modes & {"torch-eager", "torch-compile"}:
            sys.exit('benchmarks/frameworks.py needs PyTorch for the torch modes: pip install ".[torch]"')
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)
    print(f"one training step, batch {args.batch}, float32, CPU, {args.threads} thread(s); median of "
          f"{args.rounds} interleaved rounds after {args.warmup} warm-up rounds, {args.clock} clock")
    for model in args.model.split(","):
        steps, paths = {}, {}
        if modes & {"torch-eager", "torch-compile"}:
            steps.update(_torch_steps(model, ties, args.batch, modes))
        if "jax-jit" in modes:
            jax_steps, paths = _jax_steps(model, ties, args.batch)
            steps.update(jax_steps)
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        medians = _time(steps, args.rounds, args.warmup, clock)
        print(f"\nmodel {model} (input {'x'.join(map(str, MODELS[model][0]))})")
        print(f"  {'mode':14s} {'ops':16s} {'ms/step':>9s} {'x native':>9s}  path")
        for (mode, kind), m in sorted(medians.items(), key=lambda kv: (MODES.index(kv[0][0]), kv[0][1] != "native", kv[0][1])):
            base = medians[(mode, "native")]
            path = paths.get(kind, "") if mode == "jax-jit" else _torch_path(model, mode, kind, kind.split()[-1])
            print(f"  {mode:14s} {kind:16s} {m * 1e3:9.3f} {m / base:9.2f}  {path}")
    return 0


def _torch_path(model: str, mode: str, kind: str, tie: str) -> str:
    """How symgrad.torch runs each op of the model on CPU tensors in this mode."""
    if kind == "native":
        return "torch.nn"
    import torch

    import symgrad.torch as st
    s = _setting(tie)
    ops = (st.op("relu", **s), st.op("max_pool2d", kernel_size=2, **s))
    if MODELS[model][2]:
        ops += (st.op("adaptive_max_pool2d", output_size=1, **s),)

    def path(o) -> str:
        if mode == "torch-compile" and o.torch_module is not None and st.NATIVE_UNDER_COMPILE:
            return "torch backend traced"
        # the module float32 CPU tensors reach (bridge.module_for_cpu: the NumPy module where the
        # cpu backend's saved state has other fields, as split's counts)
        kernel = "NumPy module" if o._backend([torch.empty(0)])[0] is o.module else "C kernel"
        return f"custom op ({kernel})" if mode == "torch-compile" else kernel
    return ", ".join(f"{o.op}: {path(o)}" for o in ops)


if __name__ == "__main__":
    raise SystemExit(main())
