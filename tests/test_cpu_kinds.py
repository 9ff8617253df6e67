"""The native CPU backend (symgrad/backends/cpu) for the kinds other than pooling (pooling:
tests/test_cpu.py).  Oracle: the NumPy backend, bit for bit (tests/cuda_harness/check.py's
comparison on tie-heavy inputs with +-0, NaN, +-inf; float16 against NumPy in float32 rounded
once), for every tie policy x NaN rule on one case per kind, both framework presets, float16/32/64,
contiguous and strided (or channels-last) inputs; the same bits with 1 and 2 threads; the NumPy
module's errors for forged saved state.

Skipped when no C compiler is found, except under CI=true, where the compiler is required."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import symgrad
from conftest import ELEMENTWISE, WINDOWED, case_id, slow_run
from cuda_harness.check import compare, inputs_for, mismatch
from symgrad.ops import OPS, resolve
from symgrad.policy import NAN_RULES

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
if COMPILER is None and os.environ.get("CI") != "true":
    pytest.skip("no C compiler (cc, gcc, clang or $CC) on this machine: the cpu backend needs one "
                "(required when CI=true)", allow_module_level=True)

DTYPES = (np.float64, np.float32, np.float16)
# every NaN rule with every tie policy it admits
NAN_SETTINGS = [{"ties": t, "nan": n} for n, rule in NAN_RULES.items() for t in rule.policies]
PRESETS = ({"convention": "torch"}, {"convention": "jax"})

# ----------------------------------------------------------------------------- the cases
# (op, params, input shapes, settings): each kind's cases; the first of a kind is its geometry for
# every policy x NaN rule and the presets
BROADCAST = ("maximum", {}, [(3, 1), (4,)])
# one case of each op of the test tables (the first of its name; leaky_relu's slope 0 and 2 too)
_ONE_EACH = [c for k, c in enumerate(ELEMENTWISE) if c[0] not in {e[0] for e in ELEMENTWISE[:k]}
             or c[1] in ({"negative_slope": 2.0}, {"negative_slope": 0.0}, {"min": 1.0, "max": -1.0})]
ELEMENTWISE_CASES = ([(op, params, shapes, {"ties": "first"}) for op, params, shapes in _ONE_EACH]
                     + [(*BROADCAST, s) for s in NAN_SETTINGS]
                     + [(op, params, shapes, s) for op, params, shapes in
                        (BROADCAST, ("leaky_relu", {"negative_slope": 0.0}, [(4, 5)])) for s in PRESETS])


def _admitted(op: str, params: dict) -> list[dict]:
    """Every policy x NaN rule the op admits, and both presets."""
    out = []
    for settings in NAN_SETTINGS + list(PRESETS):
        try:
            resolve(op, **settings, **params)
        except ValueError:
            continue
        out.append(settings)
    return out


def _window_cases(kind: str, geometry: tuple) -> list:
    """The test tables' cases of a kind (alternately under a scan and a mask policy), and its
    geometry under every policy x NaN rule it admits and both presets."""
    table = [(op, params, shape) for op, params, shape in WINDOWED if OPS[op].kind == kind]
    cases = [(op, params, [shape], {"ties": ("first", "split")[k % 2]}) for k, (op, params, shape) in enumerate(table)]
    op, params, shapes = geometry
    return cases + [(op, params, shapes, s) for s in _admitted(op, params)]


# a reduction over rows longer than a SIMD width (70), kept dims on both sides
REDUCTION_CASES = _window_cases("reduction", ("amax", {"dim": 1}, [(3, 70, 2)]))
# maxout: 3 pieces over 2-d planes (channels-last too)
MAXOUT_CASES = _window_cases("maxout", ("maxout", {"pieces": 3}, [(2, 6, 4, 5)]))
# adaptive: overlapping windows of two sizes along each axis; and JAX's gradient start where
# output_size (1, 2) makes an element of every window along both axes (-0 there)
ADAPTIVE_CASES = (_window_cases("adaptive", ("adaptive_max_pool2d", {"output_size": (3, 4)}, [(2, 3, 7, 9)]))
                  + [("adaptive_max_pool2d", {"output_size": (1, 2)}, [(2, 2, 3, 5)], {"convention": "jax"})]
                  + [("adaptive_max_pool1d", {"output_size": 3}, [(2, 5)], {"ties": "first"}),  # unbatched
                     ("adaptive_max_pool3d", {"output_size": (2, None, 3)}, [(1, 2, 5, 3, 4)], {"ties": "split"})])
# fractional: overlapping windows (kernel 3 over 7x8 into 4x5) from random samples
FRACTIONAL_CASES = (_window_cases("fractional", ("fractional_max_pool2d", {"kernel_size": 3, "output_size": (4, 5)},
                                                 [(2, 2, 7, 8), (2, 2, 2)]))
                    + [("fractional_max_pool3d", {"kernel_size": 2, "output_size": (2, 3, 2)}, [(1, 2, 4, 5, 4), (1, 2, 3)],
                        {"ties": "first"})])
WINDOW_CASES = REDUCTION_CASES + MAXOUT_CASES + ADAPTIVE_CASES + FRACTIONAL_CASES
UNPOOLS = [("max_unpool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 6)),
           ("max_unpool2d", {"kernel_size": 2}, (3, 5, 4)),  # unbatched
           ("max_unpool3d", {"kernel_size": 2, "output_size": (5, 4, 5)}, (1, 2, 2, 2, 2))]
POLICIES = ("first", "last", "all")  # unpooling has no split
# 1d under every policy; 2d and 3d under 'all' (every writer of a slot gets its gradient) and 'first'
UNPOOL_CASES = ([(*UNPOOLS[0], t) for t in POLICIES] + [(*UNPOOLS[1], "all"), (*UNPOOLS[2], "first")])
EXPRESSIONS = [  # (text, inputs, wrt, shapes)
    ("Max(x*y, x + y, z)", None, None, [(2, 1, 4), (3, 1), (4,)]),
    ("Max(x*y, x + y, 0) + Min(x, 2*y)", None, ("x",), [(3, 4), (3, 4)]),
    ("Max(threads, y) + Min(threads, 0)", None, None, [(3, 1), (4,)]),  # the loaders' keyword as an input
]


def _settings_id(settings: dict) -> str:
    return "-".join(str(v) for v in settings.values())


def _default(settings: dict) -> bool:
    """The default run's policy x NaN rule sweep: every rule under ties first and split, and ties
    last and all under the default rule (every combination with -m slow)."""
    return settings.get("ties") in (None, "first", "split") or settings.get("nan", "dominate") == "dominate"


def _params(cases: list) -> list:
    return [c if _default(c[3]) else pytest.param(*c, marks=pytest.mark.slow) for c in cases]


def _compare_all(module, op, params, shapes, settings, layouts=("contiguous",), dtypes=DTYPES) -> list[str]:
    """Every comparison of a cpu module with the NumPy module on tie-heavy inputs, without and
    with NaN/+-inf/-0."""
    rng = np.random.default_rng(sum(map(ord, f"{op}{params}{settings}")))
    problems = []
    for specials in (False, True):
        inputs = inputs_for(rng, op, shapes, specials)
        for dtype in dtypes:
            for layout in layouts:
                problems += compare(np, op, params, settings, inputs, dtype, layout, module=module)
    return problems


def _layouts(op, shapes) -> tuple:
    if OPS[op].kind == "elementwise":
        return ("contiguous", "strided") if len(shapes) == 1 else ("contiguous",)
    if OPS[op].kind == "maxout" and len(shapes[0]) >= 3:
        return ("contiguous", "channels_last")
    if OPS[op].kind == "adaptive" and len(shapes[0]) == OPS[op].spatial + 2:
        return ("contiguous", "channels_last")
    return ("contiguous",)


@pytest.fixture(scope="module", autouse=True)
def _compiled_in_parallel(request):
    """Every library the tests below use in this run, compiled first, two at a time (the compiler
    runs in subprocesses): the tests then find them in the cache."""
    from concurrent.futures import ThreadPoolExecutor
    slow = slow_run(request.config)
    modules = [symgrad.load(op, backend="cpu", **s, **params) for op, params, _, s in ELEMENTWISE_CASES + WINDOW_CASES
               if slow or _default(s)]
    modules += [symgrad.load_expr(text, backend="cpu", inputs=names, wrt=wrt) for text, names, wrt, _ in EXPRESSIONS]
    modules += [symgrad.load(op, backend="cpu", ties=t, **params) for op, params, _, t in UNPOOL_CASES]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda m: m.library(), modules))


# ----------------------------------------------------------------------------- elementwise

@pytest.mark.parametrize("op,params,shapes,settings", _params(ELEMENTWISE_CASES),
                         ids=[f"{case_id(op, params)}-{_settings_id(s)}" for op, params, _, s in ELEMENTWISE_CASES])
def test_elementwise_equals_numpy_bit_for_bit(op, params, shapes, settings):
    module = symgrad.load(op, backend="cpu", **settings, **params)
    problems = _compare_all(module, op, params, shapes, settings, _layouts(op, shapes))
    assert not problems, "\n".join(problems[:10])


def _expression_problems(module, reference, shapes, wrt, rng, dtype) -> list[str]:
    xs = [rng.integers(-2, 3, size=s).astype(dtype) for s in shapes]  # ties and zeros
    ref = np.float32 if dtype == np.float16 else dtype
    y, saved = module.forward(*xs)
    y_ref, saved_ref = reference.forward(*[x.astype(ref) for x in xs])
    g = rng.normal(size=y_ref.shape).astype(dtype)  # sums that round differently by order
    problems = [f"forward: {mismatch(y, y_ref.astype(dtype))}"]
    for k, (a, b) in enumerate(zip(module.backward(g, saved), reference.backward(g.astype(ref), saved_ref))):
        if a is None or b is None:
            problems.append("" if a is None and b is None else f"gradient {k}: {a!r} != {b!r}")
        else:
            problems.append(f"gradient {k}: {mismatch(a, b.astype(dtype))}")
    ts = [x[::-1] if wrt is None or name in wrt else None for x, name in zip(xs, reference.INPUTS)]
    got = module.jvp(*ts, saved)
    want = reference.jvp(*[t if t is None else t.astype(ref) for t in ts], saved_ref)
    problems.append(f"jvp: {mismatch(got, want.astype(dtype))}")
    return [p for p in problems if not p.endswith(": ") and p]


def _bits_differ(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements differ bit for bit (a NaN equals any NaN)."""
    return int(((a.view(np.uint16) != b.view(np.uint16)) & ~(np.isnan(a) & np.isnan(b))).sum())


@pytest.mark.parametrize("op,params,convention", [("leaky_relu", {}, "jax"), ("clamp", {"min": -0.1, "max": 0.3}, "torch"),
                                                  ("maximum", {}, "jax")])
def test_float16_under_a_preset_computes_as_the_numpy_module(op, params, convention):
    """Every float16 value: where the preset computes float16 in float16 (constants rounded to
    float16, each product and sum rounded), the C kernels do so too (the float kernels' 0.01f
    differed on 7745 values of leaky_relu's forward under jax)."""
    x = np.arange(65536, dtype=np.uint16).view(np.float16)
    xs = [x, x[::-1].copy()][:len(OPS[op].inputs)]
    ours = symgrad.load(op, backend="cpu", convention=convention, **params)
    oracle = symgrad.load(op, convention=convention, **params)
    g = np.random.default_rng(0).standard_normal(x.shape).astype(np.float16)
    with np.errstate(all="ignore"):
        (y, saved), (y_ref, saved_ref) = ours.forward(*xs), oracle.forward(*xs)
        grads, grads_ref = ours.backward(g, saved), oracle.backward(g, saved_ref)
        tangent, tangent_ref = ours.jvp(*[g] * len(xs), saved), oracle.jvp(*[g] * len(xs), saved_ref)
    assert _bits_differ(y, y_ref) == 0
    assert [_bits_differ(a, b) for a, b in zip(grads, grads_ref)] == [0] * len(xs)
    assert _bits_differ(tangent, tangent_ref) == 0


@pytest.mark.parametrize("text,names,wrt,shapes", EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
def test_expression_equals_numpy_bit_for_bit(text, names, wrt, shapes):
    """symgrad.load_expr(..., backend="cpu"): broadcast inputs, a wrt that leaves an input out
    (backward gives None for it, jvp refuses its tangent), gradients of random grad_output."""
    module = symgrad.load_expr(text, backend="cpu", inputs=names, wrt=wrt)
    reference = symgrad.load_expr(text, inputs=names, wrt=wrt)
    rng = np.random.default_rng(14)
    for dtype in DTYPES:
        problems = _expression_problems(module, reference, shapes, wrt, rng, dtype)
        assert not problems, f"{np.dtype(dtype).name}: " + "\n".join(problems)
    if wrt is not None:
        x = np.ones(shapes[0], np.float32)
        _, saved = module.forward(*[x] * len(shapes))
        with pytest.raises(ValueError, match="must be None: the module differentiates only x"):
            module.jvp(x, x, saved)


def _check_threads_input(module, reference) -> None:
    """An expression of an input named threads: forward (the input positional, the thread count by
    keyword), backward and jvp equal the NumPy module's, float32 and bfloat16."""
    x = np.array([[-1.5, 0.0, 2.0], [0.5, -0.0, 3.0]], np.float32)
    y = np.array([0.5, 0.0, -1.0], np.float32)
    g = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    try:
        import ml_dtypes
        dtypes = (np.float32, ml_dtypes.bfloat16)
    except ModuleNotFoundError:
        dtypes = (np.float32,)
    for dtype in dtypes:
        xs = [a.astype(dtype) for a in (x, y)][:len(reference.INPUTS)]
        out, saved = module.forward(*xs, threads=2)
        out_ref, saved_ref = reference.forward(*xs)
        assert out.tobytes() == out_ref.tobytes() and out.dtype == out_ref.dtype
        got, want = module.backward(g.astype(dtype), saved, threads=1), reference.backward(g.astype(dtype), saved_ref)
        assert [a.tobytes() for a in got] == [b.tobytes() for b in want]
        tangents = [g.astype(dtype), y.astype(dtype)][:len(xs)]
        assert module.jvp(*tangents, saved, threads=2).tobytes() == reference.jvp(*tangents, saved_ref).tobytes()


def test_an_input_named_threads_works():
    """The loaders' keyword threads as an expression's input name (a SyntaxError, duplicate
    argument, before): symgrad.load_expr(..., backend="cpu") gives the NumPy module's results."""
    for text in ("Max(threads, 0)", "Max(threads, y) - Min(y, 2*threads)"):
        _check_threads_input(symgrad.load_expr(text, backend="cpu"), symgrad.load_expr(text))


def test_the_cli_writes_a_working_loader_for_an_input_named_threads(tmp_path):
    """`symgrad generate --expr ... --backend cpu` with an input named threads: exit 0 and a loader
    that imports and gives the NumPy module's results (it wrote one with a SyntaxError before)."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(symgrad.__file__).parent.parent), os.environ.get("PYTHONPATH")])))
    text = "Max(threads, y) - Min(y, 2*threads)"
    proc = subprocess.run([sys.executable, "-m", "symgrad", "generate", "--expr", text, "--name", "k",
                           "--backend", "cpu", "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    path = next(tmp_path.glob("k_*_cpu.py"))
    spec = importlib.util.spec_from_file_location("cli_threads_input", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _check_threads_input(module, symgrad.load_expr(text))


def test_a_large_broadcast_gradient_is_summed_as_numpy_sums_it():
    """An output of more than 4 * BLOCK elements: NumPy sums a broadcast input's gradient block by
    block; the loader sums the kernel's per-element gradients with the same calls in the same
    order (random values, whose sums round differently in another order)."""
    m = symgrad.load("maximum", backend="cpu", ties="split")
    ref = symgrad.load("maximum", ties="split")
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float16):
        x = rng.integers(0, 3, size=(700, 400)).astype(dtype)
        y = rng.integers(0, 3, size=(1, 400)).astype(dtype)
        g = rng.normal(size=(700, 400)).astype(dtype)
        wide = np.float32
        _, saved = m.forward(x, y)
        _, saved_ref = ref.forward(x.astype(wide), y.astype(wide))
        for a, b in zip(m.backward(g, saved), ref.backward(g.astype(wide), saved_ref)):
            assert not mismatch(a, b.astype(dtype)), mismatch(a, b.astype(dtype))


def test_elementwise_same_bits_with_one_and_two_threads():
    m = symgrad.load("maximum", backend="cpu", ties="split")
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, size=(37, 50)).astype(np.float32)
    y = rng.integers(0, 3, size=(37, 1)).astype(np.float32)
    g = rng.normal(size=(37, 50)).astype(np.float32)
    runs = []
    for threads in (1, 2, None):
        out, saved = m.forward(x, y, threads=threads)
        runs.append([out.tobytes(), *(a.tobytes() for a in m.backward(g, saved, threads=threads)),
                     m.jvp(g, g[:, :1], saved, threads=threads).tobytes()])
    assert runs[0] == runs[1] == runs[2]


def test_elementwise_forged_saved_is_refused_as_numpy_refuses_it():
    """The NumPy module's checks of saved, before any kernel reads it: the same errors."""
    m = symgrad.load("maximum", backend="cpu")
    ref = symgrad.load("maximum")
    x, y = np.zeros((3, 4), np.float32), np.zeros((1, 4), np.float32)
    for module in (m, ref):
        _, saved = module.forward(x, y)
        forged = [saved._replace(a=list(x)), saved._replace(output_shape=(3, 5)),
                  saved._replace(b=np.zeros((2, 4), np.float32)), saved._replace(dtype=np.dtype(np.int64)),
                  saved._replace(a=x.astype(np.int32))]
        errors = []
        for bad in forged:
            with pytest.raises((TypeError, ValueError)) as info:
                module.backward(np.ones((3, 4), np.float32), bad)
            errors.append((info.type, str(info.value)))
        if module is m:
            cpu_errors = errors
    assert cpu_errors == errors


# ----------------------------------------------------------------------------- window kinds

@pytest.mark.parametrize("op,params,shapes,settings", _params(WINDOW_CASES),
                         ids=[f"{case_id(op, params)}-{_settings_id(s)}" for op, params, _, s in WINDOW_CASES])
def test_window_kind_equals_numpy_bit_for_bit(op, params, shapes, settings):
    """Forward, saved state (the scan's index: its values and dtype), backward and jvp."""
    module = symgrad.load(op, backend="cpu", **settings, **params)
    problems = _compare_all(module, op, params, shapes, settings, _layouts(op, shapes))
    assert not problems, "\n".join(problems[:10])


# (op, params, input shape): one case per kind for threads and forged saved state
THREADED = [("amax", {"dim": (0, 2)}, (37, 3, 41)), ("maxout", {"pieces": 3}, (4, 9, 7, 5)),
            ("adaptive_max_pool2d", {"output_size": (5, 4)}, (3, 4, 11, 9))]


@pytest.mark.parametrize("ties", ("first", "split"))
@pytest.mark.parametrize("op,params,shape", THREADED, ids=[case_id(*c) for c in THREADED])
def test_window_kind_same_bits_with_one_and_two_threads(op, params, shape, ties):
    m = symgrad.load(op, backend="cpu", ties=ties, **params)
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, size=shape).astype(np.float32)
    runs = []
    for threads in (1, 2, None):
        y, saved = m.forward(x, threads=threads)
        g = np.random.default_rng(4).normal(size=y.shape).astype(np.float32)
        (gx,) = m.backward(g, saved, threads=threads)
        runs.append([y.tobytes(), *(a.tobytes() for a in saved if isinstance(a, np.ndarray)), gx.tobytes(),
                     m.jvp(rng.normal(size=shape).astype(np.float32) * 0 + x, saved, threads=threads).tobytes()])
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("ties", ("first", "split"))
@pytest.mark.parametrize("op,params,shape", THREADED, ids=[case_id(*c) for c in THREADED])
def test_window_kind_forged_saved_is_refused_as_numpy_refuses_it(op, params, shape, ties):
    """Every array field of saved replaced by one of another dtype, shape or memory, or a list, and
    its shapes and dtype forged: the NumPy module's error types (TypeError or ValueError, the
    messages naming saved), before any kernel reads it."""
    m = symgrad.load(op, backend="cpu", ties=ties, **params)
    ref = symgrad.load(op, ties=ties, **params)
    x = np.random.default_rng(0).integers(0, 3, size=shape).astype(np.float32)
    seen = []
    for module in (m, ref):
        y, saved = module.forward(x)
        forged = [saved._replace(output_shape=saved.output_shape + (1,)), saved._replace(dtype=np.dtype(np.int64)),
                  saved._replace(input_shape=(2,) + saved.input_shape[1:])]
        for field, a in zip(saved._fields, saved):  # the fields both keep (the cpu split keeps counts too)
            if isinstance(a, np.ndarray) and field in ref.Saved._fields:
                forged += [saved._replace(**{field: a.astype(np.float64 if a.dtype != np.float64 else np.float32)}),
                           saved._replace(**{field: a[..., :1]}), saved._replace(**{field: list(a.ravel())})]
                if a.dtype.kind == "u":
                    forged.append(saved._replace(**{field: np.full_like(a, np.iinfo(a.dtype).max)}))  # beyond the slice
        errors = []
        for bad in forged:
            for call in (lambda: module.backward(np.ones(y.shape, np.float32), bad),
                         lambda: module.jvp(np.zeros(shape, np.float32), bad)):
                with pytest.raises((TypeError, ValueError), match="saved|grad_output|tangent") as info:
                    call()
                errors.append(info.type)
        seen.append(errors)
    assert seen[0] == seen[1]


@pytest.mark.parametrize("convention", ("torch", "jax"))
def test_maxout_zero_gradients_keep_their_sign_under_each_preset(convention):
    """The presets' gradient start (PyTorch writes grad_output to the winner, JAX adds to -0): a
    -0 in grad_output reaches grad_x as the NumPy module gives it (tie-heavy inputs' comparison
    uses no -0 gradient)."""
    m = symgrad.load("maxout", backend="cpu", convention=convention, pieces=2)
    ref = symgrad.load("maxout", convention=convention, pieces=2)
    x = np.random.default_rng(1).integers(0, 3, size=(3, 8, 5)).astype(np.float32)
    g = np.where(np.random.default_rng(2).random((3, 4, 5)) < 0.5, -0.0, 1.0).astype(np.float32)
    (got,) = m.backward(g, m.forward(x)[1])
    (want,) = ref.backward(g, ref.forward(x)[1])
    assert not mismatch(got, want), mismatch(got, want)


# ----------------------------------------------------------------------------- unpooling

@pytest.mark.parametrize("op,params,shape,ties", UNPOOL_CASES, ids=[f"{case_id(*c[:2])}-{c[3]}" for c in UNPOOL_CASES])
def test_unpool_equals_numpy_bit_for_bit(op, params, shape, ties):
    """Indices with many collisions (several writers of a slot: which one stays, which gets the
    gradient, what jvp adds), values with +-0, NaN and +-inf; forward, saved, backward and jvp."""
    m = symgrad.load(op, backend="cpu", ties=ties, **params)
    ref = symgrad.load(op, ties=ties, **params)
    rng = np.random.default_rng(sum(map(ord, f"{op}{ties}")))
    x0 = rng.integers(-2, 3, size=shape).astype(np.float64)
    where = rng.random(shape) < 0.2
    x0[where] = rng.choice([np.nan, np.inf, -np.inf, -0.0], size=int(where.sum()))
    size = int(np.prod(ref.forward(x0, np.zeros(shape, np.int64))[0].shape[-OPS[op].spatial:]))
    idx = rng.integers(0, min(size, 4), size=shape)  # few slots: collisions
    for dtype in DTYPES:
        wide = np.float32 if dtype == np.float16 else dtype
        x = x0.astype(dtype)
        y, saved = m.forward(x, idx)
        y_ref, saved_ref = ref.forward(x.astype(wide), idx)
        assert not mismatch(y, y_ref.astype(dtype)), mismatch(y, y_ref.astype(dtype))
        assert np.array_equal(saved.indices, saved_ref.indices)
        assert (saved.wins is None) == (saved_ref.wins is None)
        assert saved.wins is None or np.array_equal(saved.wins, saved_ref.wins)
        g = rng.normal(size=y.shape).astype(dtype)
        (gx, none), (gx_ref, _) = m.backward(g, saved), ref.backward(g.astype(wide), saved_ref)
        assert none is None and not mismatch(gx, gx_ref.astype(dtype)), mismatch(gx, gx_ref.astype(dtype))
        t = rng.normal(size=shape).astype(dtype)  # sums that round differently by order
        got, want = m.jvp(t, None, saved), ref.jvp(t.astype(wide), None, saved_ref).astype(dtype)
        assert not mismatch(got, want), mismatch(got, want)


@pytest.mark.parametrize("ties,stride", [("all", 2), ("first", 2), ("all", 8)])
def test_unpool_backward_blocks_equal_numpy_bit_for_bit(ties, stride):
    """backward's gather runs in blocks of 16 elements, each prefetching grad_output's plane ahead
    (where the plane has at most as many cache lines as elements: not for stride 8's gaps): planes
    of 9 x 11 = 99 elements (6 blocks and a tail of 3) with indices from max pooling (in their
    window), anywhere in the plane, and colliding, each against the NumPy module in every dtype
    with 1 and 2 threads; an index outside the plane in the last block is refused."""
    torch = pytest.importorskip("torch")  # the pooled indices
    params = {"kernel_size": 2, "stride": stride}
    m = symgrad.load("max_unpool2d", backend="cpu", ties=ties, **params)
    ref = symgrad.load("max_unpool2d", ties=ties, **params)
    rng = np.random.default_rng(28 + stride)
    shape = (2, 3, 9, 11)
    pooled = torch.from_numpy(rng.normal(size=(2, 3, 8 * stride + 2, 10 * stride + 2)))  # unpooling's output size
    _, pooled_idx = torch.nn.functional.max_pool2d(pooled, return_indices=True, **params)
    size = int(np.prod(ref.forward(np.zeros(shape), np.zeros(shape, np.int64))[0].shape[-2:]))
    for idx in (pooled_idx.numpy(), rng.integers(0, size, size=shape), rng.integers(0, 3, size=shape)):
        for dtype in DTYPES:
            wide = np.float32 if dtype == np.float16 else dtype
            x = rng.normal(size=shape).astype(dtype)
            y_ref, saved_ref = ref.forward(x.astype(wide), idx)
            g = rng.normal(size=y_ref.shape).astype(dtype)
            (want, _) = ref.backward(g.astype(wide), saved_ref)
            for threads in (1, 2):
                y, saved = m.forward(x, idx, threads=threads)
                (got, none) = m.backward(g, saved, threads=threads)
                wrong = mismatch(got, want.astype(dtype))
                assert none is None and not wrong, (dtype, threads, wrong)
    y, saved = m.forward(x, idx)
    bad = saved.indices.copy()
    bad[1, -1] = size  # the tail of plane 1
    with pytest.raises(ValueError, match="indices must be in"):
        m.backward(g, saved._replace(indices=bad))


def test_unpool_and_fractional_same_bits_with_one_and_two_threads():
    """One thread a plane, each plane's writers and windows in a fixed order: 1, 2 and the default
    number of threads give identical bytes (random gradients and tangents, whose sums round
    differently in another order)."""
    rng = np.random.default_rng(9)
    unpool = symgrad.load("max_unpool2d", backend="cpu", ties="all", kernel_size=2)
    fractional = symgrad.load("fractional_max_pool2d", backend="cpu", ties="split", kernel_size=3,
                              output_size=(4, 5))
    x = rng.integers(0, 3, size=(3, 5, 4, 4)).astype(np.float32)
    idx = rng.integers(0, 5, size=x.shape)  # colliding slots
    xf = rng.integers(0, 3, size=(3, 5, 7, 8)).astype(np.float32)
    samples = rng.random((3, 5, 2))
    runs = []
    for threads in (1, 2, None):
        y, saved = unpool.forward(x, idx, threads=threads)
        g = np.random.default_rng(1).normal(size=y.shape).astype(np.float32)
        t = np.random.default_rng(2).normal(size=x.shape).astype(np.float32)
        run = [y.tobytes(), unpool.backward(g, saved, threads=threads)[0].tobytes(),
               unpool.jvp(t, None, saved, threads=threads).tobytes()]
        y, saved = fractional.forward(xf, samples, threads=threads)
        g = np.random.default_rng(3).normal(size=y.shape).astype(np.float32)
        t = np.random.default_rng(4).normal(size=xf.shape).astype(np.float32)
        run += [y.tobytes(), fractional.backward(g, saved, threads=threads)[0].tobytes(),
                fractional.jvp(t, None, saved, threads=threads).tobytes()]
        runs.append(run)
    assert runs[0] == runs[1] == runs[2]


# (op, params, input shapes) of the cases above whose libraries the fixture compiled
BFLOAT16_CASES = [(*BROADCAST, "split"), ("relu", {}, [(4, 5)], "first"), ("amax", {"dim": 1}, [(3, 70, 2)], "first"),
                  ("maxout", {"pieces": 3}, [(2, 6, 4, 5)], "split"),
                  ("adaptive_max_pool2d", {"output_size": (3, 4)}, [(2, 3, 7, 9)], "first"),
                  ("fractional_max_pool2d", {"kernel_size": 3, "output_size": (4, 5)}, [(2, 2, 7, 8), (2, 2, 2)], "split"),
                  ("max_unpool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, [(2, 3, 6), (2, 3, 6)], "all")]


@pytest.mark.parametrize("op,params,shapes,ties", BFLOAT16_CASES, ids=[f"{c[0]}-{c[3]}" for c in BFLOAT16_CASES])
def test_bfloat16_is_computed_as_the_numpy_module_computes_it(op, params, shapes, ties):
    """bfloat16 arrays (ml_dtypes) go through the NumPy module's own wrappers (widened to float32,
    the float32 kernels, rounded once), threads= passed through: the NumPy module's bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    m = symgrad.load(op, backend="cpu", ties=ties, **params)
    ref = symgrad.load(op, ties=ties, **params)
    rng = np.random.default_rng(16)
    xs = [rng.integers(-2, 3, size=s).astype(bf16) for s in shapes]
    if op == "max_unpool1d":
        xs[1] = rng.integers(0, 4, size=shapes[1])  # colliding slots
    if op.startswith("fractional"):
        xs[1] = rng.random(shapes[1]).astype(bf16)
    y, saved = m.forward(*xs, threads=2)
    y_ref, saved_ref = ref.forward(*xs)
    g = rng.normal(size=y_ref.shape).astype(bf16)
    ts = [rng.normal(size=s).astype(bf16) if k == 0 or op.startswith(("maximum", "minimum")) else None
          for k, s in enumerate(shapes)]
    pairs = [(y, y_ref), (m.jvp(*ts, saved, threads=1), ref.jvp(*ts, saved_ref))]
    pairs += [(a, b) for a, b in zip(m.backward(g, saved, threads=2), ref.backward(g, saved_ref)) if b is not None]
    for got, want in pairs:
        assert got.dtype == want.dtype == bf16
        assert not mismatch(got.astype(np.float32), want.astype(np.float32))


# ----------------------------------------------------------------------------- logsumexp

# (params, input shape): the last dim (rows longer than NumPy's pairwise block of 128, and 20000
# values where NumPy's SIMD exp and the C library's differ on thousands), a temperature, a first
# dim (the rows strided: the NumPy module's own expressions), several dims kept, every dim (the
# default), empty slices
LOGSUMEXP_CASES = [({"dim": -1}, (4, 5000)), ({"dim": -1, "temperature": 0.1}, (3, 7, 300)), ({"dim": 0}, (6, 5, 3)),
                   ({"dim": (0, 2), "keepdim": True}, (3, 4, 5)), ({}, (2, 3, 4)), ({"dim": -1}, (2, 3, 0))]


def _logsumexp_inputs(rng, shape, dtype):
    """Values over exp's range with ties, +-0, NaN and +-inf spread over the rows, and a last
    slice (along dim 0) of -inf only; as given, Fortran-ordered and reversed."""
    x = (rng.standard_normal(shape) * 30).astype(dtype)
    if x.size:
        specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1.0, 1.0, -np.inf], dtype)
        step = max(1, x.size // len(specials))
        x.reshape(-1)[::step][:len(specials)] = specials[:len(x.reshape(-1)[::step])]
        x[-1] = -np.inf
    return [x, np.asfortranarray(x), x[..., ::-1]]


@pytest.mark.parametrize("params,shape", LOGSUMEXP_CASES, ids=[f"{case_id('logsumexp', p)}-{s}" for p, s in LOGSUMEXP_CASES])
def test_logsumexp_equals_numpy_bit_for_bit(params, shape):
    """forward, backward and jvp equal the NumPy module's bytes (exp, log and the sum are NumPy's,
    the max, shift and arguments of exp the kernels'), float16/32/64, three memory orders, 1 and 2
    threads and OpenMP's default."""
    module = symgrad.load("logsumexp", backend="cpu", **params)
    reference = symgrad.load("logsumexp", **params)
    rng = np.random.default_rng(23)
    problems = []
    for dtype in DTYPES:
        for k, x in enumerate(_logsumexp_inputs(rng, shape, dtype)):
            with np.errstate(all="ignore"):
                y_ref, saved_ref = reference.forward(x)
                g = rng.standard_normal(y_ref.shape).astype(dtype)
                t = rng.standard_normal(shape).astype(dtype)
                (gx_ref,), jvp_ref = reference.backward(g, saved_ref), reference.jvp(t, saved_ref)
                for threads in (1, 2, None):
                    y, saved = module.forward(x, threads=threads)
                    (gx,) = module.backward(g, saved, threads=threads)
                    for what, got, want in (("forward", y, y_ref), ("backward", gx, gx_ref),
                                            ("jvp", module.jvp(t, saved, threads=threads), jvp_ref)):
                        if got.shape != want.shape or np.ascontiguousarray(got).tobytes() != np.ascontiguousarray(want).tobytes():
                            problems.append(f"{np.dtype(dtype).name} input {k} threads={threads} {what}: "
                                            f"{mismatch(np.ascontiguousarray(got), np.ascontiguousarray(want))}")
    assert not problems, "\n".join(problems[:10])


def test_logsumexp_forged_saved_is_refused_as_numpy_refuses_it():
    module = symgrad.load("logsumexp", backend="cpu", dim=1)
    reference = symgrad.load("logsumexp", dim=1)
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    _, saved = module.forward(x)
    forged = [saved._replace(x=x.astype(np.float64)), saved._replace(x=x[:, :2]),
              saved._replace(output=saved.output[:2]), saved._replace(input_shape=(3, 5)),
              saved._replace(dtype=np.dtype(np.int64)), saved._replace(x=list(x))]
    for bad in forged:
        for call in (lambda m, s: m.backward(np.ones(3, np.float32), s),
                     lambda m, s: m.jvp(np.ones((3, 4), np.float32), s)):
            with pytest.raises((TypeError, ValueError)) as want:
                call(reference, reference.Saved(*bad))
            with pytest.raises(type(want.value)) as got:
                call(module, bad)
            assert str(got.value) == str(want.value)


def test_logsumexp_bfloat16_goes_through_the_numpy_modules_wrappers():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    module = symgrad.load("logsumexp", backend="cpu", dim=-1)
    reference = symgrad.load("logsumexp", dim=-1)
    x = np.random.default_rng(5).standard_normal((3, 50)).astype(ml_dtypes.bfloat16)
    (y, saved), (y_ref, saved_ref) = module.forward(x, threads=2), reference.forward(x)
    g = np.ones(3, ml_dtypes.bfloat16)
    assert y.tobytes() == y_ref.tobytes() and y.dtype == y_ref.dtype
    assert module.backward(g, saved)[0].tobytes() == reference.backward(g, saved_ref)[0].tobytes()
    assert module.jvp(x, saved).tobytes() == reference.jvp(x, saved_ref).tobytes()
