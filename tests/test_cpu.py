"""The native CPU backend (symgrad/backends/cpu): C kernels compiled on first use, called through
ctypes.  Oracle: the NumPy backend, bit for bit (tests/cuda_harness/check.py's comparison and
tie-heavy inputs with +-0, NaN, +-inf; float16 against the NumPy module in float16: max
pooling adds its windows' terms in float16, each add rounded, as that module does), for every
tie policy x NaN rule, both framework presets, float16/32/64, NCHW, channels-last and strided
inputs, several geometries; the same bits with 1 and 2 threads; the compile cache; the errors.

Skipped when no C compiler is found, except under CI=true, where the compiler is required."""

from __future__ import annotations

import os
import shutil
import stat
import sys

import numpy as np
import pytest

import symgrad
from conftest import WINDOWED, case_id, slow_run
from cuda_harness.check import compare, inputs_for, mismatch
from symgrad.ops import resolve
from symgrad.policy import NAN_RULES
from symgrad.backends import cpu

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
if COMPILER is None and os.environ.get("CI") != "true":
    pytest.skip("no C compiler (cc, gcc, clang or $CC) on this machine: the cpu backend needs one "
                "(required when CI=true)", allow_module_level=True)

LAYOUTS = ("contiguous", "channels_last", "strided")
DTYPES = (np.float64, np.float32, np.float16)
POOLS = [(op, params, shape) for op, params, shape in WINDOWED if op.startswith("max_pool")]
OVERLAP = ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 7, 6))
# every NaN rule with every tie policy it admits
NAN_SETTINGS = [{"ties": t, "nan": n} for n, rule in NAN_RULES.items() for t in rule.policies]


def _problems(op, params, shape, settings, layouts=LAYOUTS, dtypes=DTYPES) -> list[str]:
    """Every comparison of the cpu module with the NumPy module on tie-heavy inputs, without and
    with NaN/+-inf/-0."""
    module = symgrad.load(op, backend="cpu", **settings, **params)
    rng = np.random.default_rng(sum(map(ord, f"{op}{params}{settings}")))
    problems = []
    for specials in (False, True):
        inputs = inputs_for(rng, op, [shape], specials)
        for dtype in dtypes:
            for layout in layouts:
                if layout == "channels_last" and len(shape) != resolve(op, **params).spec.spatial + 2:
                    continue
                problems += compare(np, op, params, settings, inputs, dtype, layout, module=module, half=True)
    return problems


# the geometries under a scan policy and the counted mask one; every policy (each NaN rule with
# the policies it admits) on OVERLAP below
GEOMETRY_POLICIES = ("last", "split")
# backward's write form (windows that tile the input) with rests past the last window, and its
# scatter form with bands of rows (one plane shared by threads; a plane over 32K elements), under
# ties=first, and under JAX's preset (padding takes part as -inf) where there is padding
BACKWARD_FORMS = [
    ("max_pool2d", {"kernel_size": 2}, (2, 3, 7, 9)),
    ("max_pool3d", {"kernel_size": 2}, (1, 2, 5, 4, 7)),
    ("max_pool1d", {"kernel_size": 3}, (2, 2, 10)),
    ("max_pool2d", {"kernel_size": (3, 2)}, (1, 2, 8, 7)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (1, 1, 23, 19)),
    ("max_pool2d", {"kernel_size": 3, "stride": 1, "padding": 1}, (1, 2, 200, 170)),
    ("max_pool3d", {"kernel_size": 3, "stride": 2, "padding": 1}, (1, 1, 9, 6, 7)),
    ("max_pool1d", {"kernel_size": 4, "stride": 3, "padding": 2}, (1, 3, 40)),
    # 1-d: the scatter's winner offset printed from the geometry (no table), dilated
    ("max_pool1d", {"kernel_size": 4, "stride": 3, "padding": 2, "dilation": 2}, (2, 3, 41)),
]
FORM_SETTINGS = [(op, params, shape, st) for op, params, shape in BACKWARD_FORMS
                 for st in ({"ties": "first"}, {"convention": "jax"})
                 if st.get("ties") or any(np.atleast_1d(params.get("padding", 0)))]
# the mask form's write backward (windows that tile the input: the first four), counted (split),
# and not (all) with -m slow
FORM_SETTINGS += [(*form, {"ties": "split"}) for form in BACKWARD_FORMS[:2]]
SLOW_FORM_SETTINGS = ([(*form, {"ties": "split"}) for form in BACKWARD_FORMS[2:4]]
                      + [(*BACKWARD_FORMS[0], {"ties": "all"})])


def _default_geometry(i: int, ties: str) -> bool:
    """The default run's geometry comparisons: the pools take the scan and the mask policy in
    turn (every pool under both with -m slow)."""
    return ties == GEOMETRY_POLICIES[i % 2]


def _default_nan(settings) -> bool:
    """The default run's NaN-rule comparisons: each rule under ties first and split."""
    return settings["ties"] in ("first", "split")


@pytest.fixture(scope="module", autouse=True)
def _compiled_in_parallel(request):
    """Every library the tests below use in this run, compiled first, two at a time (the compiler
    runs in subprocesses): the tests then find them in the cache."""
    from concurrent.futures import ThreadPoolExecutor
    slow = slow_run(request.config)
    settings = ([(op, params, {"ties": t}) for i, (op, params, _) in enumerate(POOLS) for t in GEOMETRY_POLICIES
                 if slow or _default_geometry(i, t)]
                + [(OVERLAP[0], OVERLAP[1], s) for s in NAN_SETTINGS if slow or _default_nan(s)]
                + [(op, params, {"convention": c}) for op, params, _ in (OVERLAP, POOLS[3]) for c in ("torch", "jax")]
                + [(op, params, st) for op, params, _, st in FORM_SETTINGS])
    modules = [symgrad.load(op, backend="cpu", **st, **params) for op, params, st in settings]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda m: m.library(), modules))


@pytest.mark.parametrize("op,params,shape,ties", [
    (*c, t) if _default_geometry(i, t) else pytest.param(*c, t, marks=pytest.mark.slow)
    for i, c in enumerate(POOLS) for t in GEOMETRY_POLICIES], ids=[f"{case_id(*c)}-{t}" for c in POOLS for t in GEOMETRY_POLICIES])
def test_equals_numpy_bit_for_bit(op, params, shape, ties):
    problems = _problems(op, params, shape, {"ties": ties})
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("settings", [s if _default_nan(s) else pytest.param(s, marks=pytest.mark.slow)
                                      for s in NAN_SETTINGS], ids=[f"{s['ties']}-{s['nan']}" for s in NAN_SETTINGS])
def test_equals_numpy_under_every_nan_rule(settings):
    problems = _problems(*OVERLAP, settings)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("convention", ("torch", "jax"))
@pytest.mark.parametrize("op,params,shape", [OVERLAP, POOLS[3]], ids=[case_id(*OVERLAP), case_id(*POOLS[3])])
def test_equals_numpy_under_each_preset(op, params, shape, convention):
    """A preset's NaN rule and padding (JAX: -inf that takes part) reach the C kernels."""
    problems = _problems(op, params, shape, {"convention": convention})
    assert not problems, "\n".join(problems[:10])


# ----------------------------------------------------------------------------- threads

def test_the_same_bits_with_one_and_two_threads():
    """Each element is computed by one thread in a fixed order: 1 and 2 threads (and OpenMP's
    default) give identical bytes for forward, saved, backward and jvp, on overlapping windows
    where backward adds several gradients per element, under a scan and a mask policy."""
    rng = np.random.default_rng(3)
    for ties in ("first", "split"):
        m = symgrad.load("max_pool2d", backend="cpu", ties=ties, kernel_size=3, stride=1, padding=1)
        x = rng.integers(0, 3, size=(3, 5, 17, 19)).astype(np.float32)
        g = rng.standard_normal((3, 5, 17, 19)).astype(np.float32)  # sums that round differently by order
        runs = []
        for threads in (1, 2, None):
            y, saved = m.forward(x, threads=threads)
            (gx,) = m.backward(g, saved, threads=threads)
            runs.append([y.tobytes(), *(a.tobytes() for a in saved if isinstance(a, np.ndarray)),
                         gx.tobytes(), m.jvp(g, saved, threads=threads).tobytes()])
        assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("op,params,shape,settings",
                         FORM_SETTINGS + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW_FORM_SETTINGS],
                         ids=[f"{case_id(op, params, shape)}-{next(iter(st.values()))}"
                              for op, params, shape, st in FORM_SETTINGS + SLOW_FORM_SETTINGS])
def test_backward_forms_equal_numpy_with_rests_bands_and_threads(monkeypatch, op, params, shape, settings):
    """backward (write or scatter form) equals the NumPy backend's bit for bit with 1, 2 and 3
    threads (more threads than planes: bands of rows), NCHW and channels-last, float64/32/16 (float16
    against the NumPy module in float16, each add rounded), on tie-heavy inputs and gradients whose
    sums round differently by order."""
    monkeypatch.setattr(cpu, "max_threads", lambda: 3)  # 3 threads, whatever the CPUs
    module = symgrad.load(op, backend="cpu", **settings, **params)
    reference = symgrad.load(op, **settings, **params)
    rng = np.random.default_rng(11)
    x = rng.integers(0, 3, size=shape).astype(np.float64)
    problems = []
    for dtype in DTYPES:
        y_ref, saved_ref = reference.forward(x.astype(dtype))
        g = rng.standard_normal(y_ref.shape).astype(dtype)
        (want,) = reference.backward(g, saved_ref)
        for cl in (False, True):
            order = (0, *range(2, len(shape)), 1)  # channels-last memory order
            def lay(a):
                return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1) if cl else a
            for threads in (1, 2, 3):
                _, saved = module.forward(lay(x.astype(dtype)), threads=threads)
                (got,) = module.backward(lay(g), saved, threads=threads)
                if cl and got.transpose(order).flags.c_contiguous is False:
                    problems.append(f"{dtype.__name__} channels-last threads={threads}: not channels-last")
                if np.ascontiguousarray(got).tobytes() != want.tobytes():
                    problems.append(f"{dtype.__name__} {'channels-last' if cl else 'NCHW'} threads={threads}: "
                                    f"{mismatch(np.ascontiguousarray(got), want)}")
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("op,shape", [("max_pool1d", (2, 3, 11)), ("max_pool2d", (2, 3, 9, 11)),
                                      ("max_pool3d", (1, 2, 7, 5, 9))])
def test_padding_that_wins_drops_its_gradient_as_numpy(op, shape):
    """Under the jax convention padding (-inf) takes part, and in a window of -inf elements the
    padding that comes first in the scan wins: forward and backward (whose windows inside the
    input skip the bounds check) equal the NumPy backend's bit for bit, NCHW and channels-last,
    1 and 2 threads."""
    params = {"kernel_size": 3, "stride": 2, "padding": 1}
    module = symgrad.load(op, backend="cpu", convention="jax", **params)
    reference = symgrad.load(op, convention="jax", **params)
    rng = np.random.default_rng(5)
    x = rng.choice(np.array([-np.inf, 0.0, 1.0], np.float32), size=shape, p=[0.8, 0.1, 0.1])
    y_ref, saved_ref = reference.forward(x)
    g = rng.standard_normal(y_ref.shape).astype(np.float32)
    (want,) = reference.backward(g, saved_ref)
    for cl in (False, True):
        def lay(a):
            return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1) if cl else a
        for threads in (1, 2):
            y, saved = module.forward(lay(x), threads=threads)
            (got,) = module.backward(lay(g), saved, threads=threads)
            assert np.ascontiguousarray(y).tobytes() == y_ref.tobytes(), (cl, threads)
            assert np.ascontiguousarray(got).tobytes() == want.tobytes(), (cl, threads, mismatch(np.ascontiguousarray(got), want))


_FORK_SCRIPT = """
import os, sys
import numpy as np
import symgrad
m = symgrad.load("max_pool2d", backend="cpu", kernel_size=3, stride=2, padding=1)
x = np.random.default_rng(0).standard_normal((2, 4, 33, 31)).astype(np.float32)
y, saved = m.forward(x, threads=2)  # OpenMP threads run in the parent
(g,) = m.backward(np.ones_like(y), saved, threads=2)
pid = os.fork()
if pid == 0:  # the child: several threads asked for (2, and OpenMP's default)
    y2, saved2 = m.forward(x, threads=2)
    (g2,) = m.backward(np.ones_like(y), saved2)
    os._exit(0 if y2.tobytes() == y.tobytes() and g2.tobytes() == g.tobytes() else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
def test_a_process_forked_after_openmp_threads_ran_does_not_hang():
    """GNU libgomp's threads do not survive fork(): a child that asks for several threads after
    its parent ran a kernel on two would wait forever; the loaders run it on one thread (the same
    results).  Run in a subprocess with a timeout, so that a hang fails the test."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(__import__("pathlib").Path(symgrad.__file__).parent.parent), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_threads_argument_is_checked(monkeypatch):
    """threads= and $SYMGRAD_NUM_THREADS: a positive integer, else one error line naming it."""
    m = symgrad.load("max_pool1d", backend="cpu", kernel_size=2)
    x = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="threads must be a positive int"):
        m.forward(x, threads=0)
    for bad in (1.5, True, "2", np.zeros((3, 3))):
        with pytest.raises(TypeError, match="threads must be a positive int") as info:
            m.forward(x, threads=bad)
        assert "\n" not in str(info.value)
    for bad in ("0", "-2", "two", "1.5", "\u00b2"):
        monkeypatch.setenv("SYMGRAD_NUM_THREADS", bad)
        with pytest.raises(ValueError, match=r"\$SYMGRAD_NUM_THREADS must be a positive integer"):
            m.forward(x)


# the thread counts issue 28 found crashing libgomp (threads=100000: a segfault; 2**31-1: abort,
# "Out of memory allocating 481036338272 bytes"), through the argument and the environment
_HUGE_THREADS_SCRIPT = """
import os
import numpy as np
import symgrad
pool = symgrad.load("max_pool2d", backend="cpu", kernel_size=3, stride=2, padding=1)
relu = symgrad.load("relu", backend="cpu")
x = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(np.float32)
os.environ["SYMGRAD_NUM_THREADS"] = str(10**9)  # for threads=None
for m in (pool, relu):
    y1, s1 = m.forward(x, threads=1)
    (g1,) = m.backward(np.ones_like(y1), s1, threads=1)
    for n in (100000, 2**31 - 1, 2**63, 10**30, None):
        y, s = m.forward(x, threads=n)
        (g,) = m.backward(np.ones_like(y), s, threads=n)
        assert y.tobytes() == y1.tobytes() and g.tobytes() == g1.tobytes(), (m.OP, n)
"""


def test_huge_thread_counts_run_on_at_most_the_cpus():
    """threads= (and $SYMGRAD_NUM_THREADS) beyond the CPUs this process may use run on that many
    (at most), with the results of one thread; in a subprocess, where a crash fails the test."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(__import__("pathlib").Path(symgrad.__file__).parent.parent), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _HUGE_THREADS_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


def _recorded_threads(monkeypatch, module) -> list:
    """(role, thread count) of each of the module's kernel calls, as its _call receives them."""
    seen = []
    real = module._call

    def counted(role, *args):
        seen.append((role, args[-1]))
        return real(role, *args)
    monkeypatch.setattr(module, "_call", counted)
    return seen


def test_numpy_callers_threads_come_from_the_call_the_module_or_the_environment(monkeypatch):
    """A call's threads=, else the module's THREADS, else $SYMGRAD_NUM_THREADS, else 0 (OpenMP's
    default) reach the kernels."""
    m = symgrad.load("max_pool2d", backend="cpu", kernel_size=2)
    seen = _recorded_threads(monkeypatch, m)
    x = np.zeros((1, 2, 4, 4), np.float32)
    monkeypatch.delenv("SYMGRAD_NUM_THREADS", raising=False)
    m.forward(x)
    m.forward(x, threads=2)
    monkeypatch.setenv("SYMGRAD_NUM_THREADS", "3")
    m.forward(x)
    m.forward(x, threads=2)
    monkeypatch.setattr(m, "THREADS", 1)
    m.forward(x)
    assert [n for _, n in seen] == [0, 2, 3, 2, 1]


def test_symgrad_torch_runs_the_kernels_on_torchs_thread_count(monkeypatch):
    """Under symgrad.torch the cpu backend's forward, backward and jvp (double backward) run on
    torch.get_num_threads() threads (not OpenMP's default: every core, which oversubscribed),
    or on $SYMGRAD_NUM_THREADS where it is set."""
    torch = pytest.importorskip("torch")
    import symgrad.torch as st
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", "cpu")
    monkeypatch.delenv("SYMGRAD_NUM_THREADS", raising=False)
    params = {"kernel_size": 3, "stride": 2, "padding": 1}
    pool = st.op("max_pool2d", **params)
    seen = _recorded_threads(monkeypatch, symgrad.load("max_pool2d", backend="cpu", **params))
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    before = torch.get_num_threads()

    def counts() -> set:
        seen.clear()
        y = pool(x)
        go = torch.ones_like(y, requires_grad=True)
        (gx,) = torch.autograd.grad(y, x, go, create_graph=True)
        torch.autograd.grad(gx.sum(), go)  # the derivative of backward in grad_output: jvp
        assert {role for role, _ in seen} == {"forward", "backward", "jvp"}, seen
        return {n for _, n in seen}
    try:
        for n in (1, 3, 2):
            torch.set_num_threads(n)
            assert counts() == {n}
        monkeypatch.setenv("SYMGRAD_NUM_THREADS", "3")
        assert counts() == {3}
    finally:
        torch.set_num_threads(before)


def test_symgrad_jax_runs_the_kernels_on_one_thread_or_the_setting(monkeypatch):
    """Under symgrad.jax (XLA's CPU runtime has its own threads) the cpu backend's kernels run on
    one thread in the callbacks (OpenMP's default, every core, made a jit(grad) 10x slower), or
    on $SYMGRAD_NUM_THREADS where it is set, read at each call (no new trace)."""
    jax = pytest.importorskip("jax")
    import symgrad.jax as sj
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", "cpu")
    monkeypatch.delenv("SYMGRAD_NUM_THREADS", raising=False)
    # (max pooling takes the native path in symgrad.jax.op; its callback path is _callback_op)
    f = sj._callback_op("max_pool2d", kernel_size=3, stride=2, padding=1)
    seen = _recorded_threads(monkeypatch, f.cpu_op.module)
    x = jax.numpy.asarray(np.random.default_rng(1).standard_normal((2, 3, 9, 8)), jax.numpy.float32)
    grad = jax.jit(jax.grad(lambda v: f(v).sum()))

    def counts() -> set:
        seen.clear()
        jax.block_until_ready(grad(x))
        jax.block_until_ready(jax.jvp(f, (x,), (x,)))
        assert {"forward", "backward", "jvp"} <= {role for role, _ in seen}, seen
        return {n for _, n in seen}
    assert counts() == {1}
    monkeypatch.setenv("SYMGRAD_NUM_THREADS", "2")
    assert counts() == {2}


# ----------------------------------------------------------------------------- the library and its cache

def _fresh(monkeypatch, module):
    """The module as a new process finds it: its library not yet loaded."""
    monkeypatch.setattr(module, "_library", None)


def _compiles(monkeypatch, module) -> list:
    calls = []
    real = module._compile

    def counted(cc, source):
        calls.append(cc)
        return real(cc, source)
    monkeypatch.setattr(module, "_compile", counted)
    return calls


def _library_file(module):
    return module.library_path(module._source(), module.compiler())


def test_library_is_compiled_once_and_kept_owner_only(monkeypatch):
    m = symgrad.load("max_pool1d", backend="cpu", kernel_size=3, stride=2, ceil_mode=True)
    x = np.arange(14, dtype=np.float64).reshape(2, 7)
    y, _ = m.forward(x)  # compiled here, or found from an earlier test
    path = _library_file(m)
    assert path.parent == m.SOURCE.parent and path.name.startswith(m.PREFIX + ".")
    for p in (path, path.with_name(path.name + ".sha256")):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    _fresh(monkeypatch, m)
    calls = _compiles(monkeypatch, m)
    y2, _ = m.forward(x)
    assert calls == [] and np.array_equal(y, y2)  # the second load does not compile


def test_a_tampered_library_is_not_loaded(monkeypatch):
    m = symgrad.load("max_pool1d", backend="cpu", kernel_size=2, ties="last")
    x = np.array([[1.0, 1.0, 2.0, 0.0]])
    m.forward(x)
    path = _library_file(m)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered = path.with_name("tampered")
    tampered.write_bytes(bytes(data))
    tampered.chmod(0o600)
    os.replace(tampered, path)  # same name, other bytes (a new file: the loaded one stays mapped)
    _fresh(monkeypatch, m)
    calls = _compiles(monkeypatch, m)
    y, saved = m.forward(x)
    assert len(calls) == 1  # compiled again, not loaded
    assert path.read_bytes() != bytes(data)
    assert y.tolist() == [[1.0, 2.0]] and saved.index.tolist() == [[1, 0]]


def test_an_edited_source_gets_its_own_library(monkeypatch, tmp_path):
    """The library is named by its source's hash: a kernel whose take is edited (a later equal
    element takes over: 'last' instead of 'first') is compiled anew, and the comparison with the
    NumPy backend sees the difference (the tests above can fail)."""
    m = symgrad.load("max_pool2d", backend="cpu", ties="first", kernel_size=2)
    source = m._source()
    edited = source.replace("return (v > best)", "return (v >= best)")
    assert edited != source
    tmp_path.chmod(0o700)
    (tmp_path / m.SOURCE.name).write_text(edited)
    monkeypatch.setattr(m, "SOURCE", tmp_path / m.SOURCE.name)
    _fresh(monkeypatch, m)
    rng = np.random.default_rng(0)
    problems = compare(np, "max_pool2d", {"kernel_size": 2}, "first",
                       inputs_for(rng, "max_pool2d", [(2, 3, 6, 6)], False), np.float32, module=m)
    assert any("saved index differs" in p for p in problems)
    assert any(p.suffix == ".so" for p in tmp_path.iterdir())


def test_no_compiler_is_one_clear_error(monkeypatch, tmp_path):
    m = symgrad.load("max_pool1d", backend="cpu", kernel_size=2, ties="split")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    _fresh(monkeypatch, m)
    with pytest.raises(RuntimeError, match=r"needs a C compiler .* install one .*gcc"):
        m.forward(np.zeros((1, 1, 4)))


# ----------------------------------------------------------------------------- interface and errors

def test_every_form_is_built_and_a_form_not_built_is_refused_naming_the_ones_there_are(monkeypatch):
    from symgrad.backends import cpu
    from symgrad.kinds import KINDS
    from symgrad.lower import form_of
    from symgrad import backends
    from symgrad.ops import resolve
    from symgrad.pipeline import render
    # every kind's form, expressions, order statistics and bags too
    assert {form_of(kind) for kind in KINDS.values()} - set(cpu.FORMS) == set()
    monkeypatch.setattr(cpu, "FORMS", tuple(f for f in cpu.FORMS if f != "LogSumExpKernel"))
    with pytest.raises(ValueError, match="cpu backend builds the .* forms? only"):
        render(resolve("logsumexp"), backends.get("cpu"))  # not symgrad.load: it may find the module in the cache


def test_cli_generates_the_c_source_and_its_loader(tmp_path, capsys):
    from symgrad.cli import main
    for op, args in (("max_pool3d", ["--kernel-size", "2"]), ("logsumexp", [])):
        out = tmp_path / op
        assert main(["generate", op, *args, "--backend", "cpu", "--out", str(out)]) == 0
        assert sorted(p.suffix for p in out.iterdir()) == [".c", ".py"]


def test_interface_is_the_numpy_modules():
    numpy_module = symgrad.load("max_pool2d", kernel_size=2, ties="split")
    m = symgrad.load("max_pool2d", backend="cpu", kernel_size=2, ties="split")
    for name in ("OP", "TIES", "PARAMS", "INPUTS", "PIECEWISE_LINEAR"):
        assert getattr(m, name) == getattr(numpy_module, name), name
    assert set(numpy_module.Saved._fields) <= set(m.Saved._fields)
    with pytest.raises(TypeError, match="torch.Tensor"):
        import torch
        m.forward(torch.zeros(1, 2, 4, 4))
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        m.forward(np.zeros((1, 2, 4, 4), np.int32))
    with pytest.raises(ValueError, match="dims"):
        m.forward(np.zeros((4, 4)))


@pytest.mark.parametrize("ties", ("first", "split"))
def test_forged_saved_is_refused_with_no_write_outside_the_arrays(ties):
    """Saved values forward did not make are refused (TypeError/ValueError naming saved): shapes,
    dtypes and layouts before any kernel runs; an index outside the window either before the
    kernel (jvp, the other forms) or by the write-form kernel itself, which reads the index in its
    own pass, writes only inside the arrays and reports it, and the loader refuses."""
    m = symgrad.load("max_pool2d", backend="cpu", kernel_size=2, ties=ties)
    x = np.zeros((2, 3, 4, 4), np.float32)
    y, saved = m.forward(x)
    field = saved._fields[0]  # index (first) or x (split)
    a = getattr(saved, field)
    forged = [
        saved._replace(**{field: a.astype(np.float64 if a.dtype != np.float64 else np.float32)}),
        saved._replace(**{field: a[..., :1]}),
        saved._replace(**{field: np.asfortranarray(a) if a.ndim else a}),
        saved._replace(**{field: list(a.ravel())}),
        saved._replace(output_shape=(2, 3, 3, 2)),
        saved._replace(input_shape=(2, 3, 1, 1)),
        saved._replace(dtype=np.dtype(np.int64)),
    ]
    if field == "index":
        forged.append(saved._replace(index=np.full_like(a, 4)))  # beyond the window's 4 elements
    for bad in forged:
        with pytest.raises((TypeError, ValueError), match=r"saved"):
            m.backward(np.ones(bad.output_shape, np.float32), bad)
        with pytest.raises((TypeError, ValueError), match=r"saved"):
            m.jvp(np.zeros(bad.input_shape, np.float32), bad)


def _outcome(call):
    """What a call gives: its error's type and message, or its result's bits."""
    try:
        return tuple(g.tobytes() for g in call())
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("ties, params, shape", [  # write form (the kernel checks the index), scatter form
    ("first", dict(kernel_size=2), (1, 3, 4, 4)), ("split", dict(kernel_size=2), (1, 3, 4, 4)),
    ("first", dict(kernel_size=3, stride=2, padding=1), (1, 3, 5, 5))])
def test_backward_after_a_checked_call_still_refuses_forged_saved(ties, params, shape):
    """backward keeps the shapes of a call that passed its checks (_BACKWARD_KNOWN): a later Saved
    whose shapes or dtype only compare equal to them (floats, bools, NumPy ints, the dtype's
    scalar type or name), or whose arrays changed, gets what it gets with nothing kept (the same
    error, or the same bits), and a plain repeat gives the first call's bits."""
    m = symgrad.load("max_pool2d", backend="cpu", ties=ties, **params)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    y, saved = m.forward(x)
    g = np.random.default_rng(4).standard_normal(y.shape).astype(np.float32)
    field = saved._fields[0]
    a = getattr(saved, field)
    ins, outs = saved.input_shape, saved.output_shape
    forged = [
        saved._replace(input_shape=(1.0,) + ins[1:]),
        saved._replace(input_shape=ins[:-1] + (np.int64(ins[-1]),)),
        saved._replace(input_shape=(True,) + ins[1:], output_shape=(True,) + outs[1:]),
        saved._replace(output_shape=outs[:-1] + (float(outs[-1]),)),
        saved._replace(dtype=np.float32),
        saved._replace(dtype="float32"),
        saved._replace(**{field: a.astype(a.dtype.newbyteorder(">"))}),
        saved._replace(**{field: np.asfortranarray(a)}),
    ]
    if field == "index":
        window = params["kernel_size"] ** 2
        forged.append(saved._replace(index=np.full_like(a, window)))  # beyond the window
    calls = [(g, bad) for bad in forged] + [(np.ma.masked_array(g), saved), (g.astype(">f4"), saved),
                                            (g.astype(np.float64), saved), (g[..., None][..., 0], saved)]

    def alone(call):  # with nothing kept
        m._BACKWARD_KNOWN.clear()
        return _outcome(lambda: m.backward(*call))

    expected = [alone(call) for call in calls]
    assert sum(e[0] in ("TypeError", "ValueError") for e in expected) >= 7  # the shapes' and dtype's
    first = alone((g, saved))
    assert len(m._BACKWARD_KNOWN) == 1
    for call, outcome in zip(calls, expected):  # each after the plain call was kept
        assert _outcome(lambda: m.backward(g, saved)) == first
        assert _outcome(lambda: m.backward(*call)) == outcome


def test_backward_keeps_at_most_256_checked_calls():
    """_BACKWARD_KNOWN (a cpu/_bounded.py.jinja _Bounded) holds at most 256 calls: the 257th drops
    the others, whose next backward takes every check again, and each backward still routes
    grad_output to its window's first maximum (a loop over the windows)."""
    m = symgrad.load("max_pool2d", backend="cpu", kernel_size=2)
    m._BACKWARD_KNOWN.clear()
    rng = np.random.default_rng(5)
    calls = []
    for k in range(257):
        x = rng.permutation(2 * 2 * (k + 1)).reshape(1, 1, 2, 2 * (k + 1)).astype(np.float32)
        y, saved = m.forward(x)
        g = (1 + np.arange(y.size, dtype=np.float32)).reshape(y.shape)
        calls.append((x, g, m.backward(g, saved)[0], saved))
        assert len(m._BACKWARD_KNOWN) == k % 256 + 1
    for x, g, gx, saved in calls[:2] + calls[-1:]:  # dropped and kept calls
        want = np.zeros_like(x)
        for j in range(x.shape[-1] // 2):
            window = x[0, 0, :, 2 * j:2 * j + 2]
            r, c = np.unravel_index(np.argmax(window), window.shape)
            want[0, 0, r, 2 * j + c] = g[0, 0, 0, j]
        np.testing.assert_array_equal(gx, want)
        np.testing.assert_array_equal(m.backward(g, saved)[0], want)


def test_cache_clear_removes_the_c_source_and_the_library(tmp_path, monkeypatch):
    from symgrad import api, cache
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(api, "_LOADED", {})
    m = symgrad.load("max_pool1d", backend="cpu", kernel_size=2, stride=1)
    m.forward(np.zeros((1, 1, 3)))
    folder = m.SOURCE.parent
    assert {p.suffix for p in folder.iterdir()} == {".c", ".py", ".so", ".sha256"}
    assert cache.info()["modules"] == 1
    result = cache.clear()
    assert result["kept"] == 0 and result["modules"] == 1 and not folder.exists()


@pytest.mark.parametrize("ties", ("first", "split"))
def test_rows_longer_than_a_chunk(ties):
    """Forward scans a row's outputs in chunks of SG_CHUNK (256): rows of 550 and 300 outputs,
    with padding at both ends and overlapping windows, equal the NumPy backend's bit for bit."""
    params = {"kernel_size": 3, "stride": 2, "padding": 1}
    for op, shape in (("max_pool1d", (2, 2, 1100)), ("max_pool2d", (1, 2, 5, 600))):
        module = symgrad.load(op, backend="cpu", ties=ties, **params)
        rng = np.random.default_rng(7)
        problems = []
        for specials in (False, True):
            inputs = inputs_for(rng, op, [shape], specials)
            for dtype in (np.float32, np.float16):
                problems += compare(np, op, params, ties, inputs, dtype, module=module, half=True)
        assert not problems, "\n".join(problems[:10])


def test_float16_conversions_equal_numpys_for_every_half_and_the_halfway_floats(tmp_path):
    """The C helpers every source carries to load float16 into float and to round float into
    float16 (bit blends, no branch, so that float16 loops vectorize) equal NumPy's conversions:
    all 65536 halves loaded, and rounded back; every float32 halfway between two neighbouring
    halves, its neighbours, and 2^20 random float32 bit patterns rounded (round to nearest even,
    overflow to inf; a NaN stays a NaN, its payload not compared)."""
    import ctypes
    import subprocess
    source = symgrad.load("relu", backend="cpu")._source()
    helpers = source[source.index("#include"):source.index("// " + "-" * 76 + " the op")]
    c = tmp_path / "convert.c"
    c.write_text(helpers + "\n".join([
        "void sg_test_load(const sg_half* h, float* f, const I n) {",
        "  for (I i = 0; i < n; ++i) f[i] = sg_half_to_float(h[i]);",
        "}",
        "void sg_test_store(const float* f, sg_half* h, const I n) {",
        "  for (I i = 0; i < n; ++i) h[i] = sg_float_to_half(f[i]);",
        "}", ""]), encoding="utf-8")
    so = tmp_path / "convert.so"
    subprocess.run([COMPILER, *cpu.CFLAGS, str(c), "-o", str(so)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))

    halves = np.arange(2**16, dtype=np.uint16).view(np.float16)
    loaded = np.empty(halves.shape, np.float32)
    lib.sg_test_load(ctypes.c_void_p(halves.ctypes.data), ctypes.c_void_p(loaded.ctypes.data),
                     ctypes.c_int64(halves.size))
    want = halves.astype(np.float32)
    assert np.array_equal(loaded.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.array_equal(np.isnan(loaded), np.isnan(want))

    finite = np.sort(want[np.isfinite(want)])
    middles = (finite[:-1] / 2 + finite[1:] / 2).astype(np.float32)  # exact: halves have 11-bit significands
    floats = np.concatenate([want, middles, np.nextafter(middles, np.float32(np.inf)),
                             np.nextafter(middles, np.float32(-np.inf)),
                             np.random.default_rng(0).integers(0, 2**32, 2**20, dtype=np.uint32).view(np.float32)])
    rounded = np.empty(floats.shape, np.float16)
    lib.sg_test_store(ctypes.c_void_p(floats.ctypes.data), ctypes.c_void_p(rounded.ctypes.data),
                      ctypes.c_int64(floats.size))
    with np.errstate(over="ignore", invalid="ignore"):
        want = floats.astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(rounded.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.array_equal(np.isnan(rounded), nan)


# ----------------------------------------------------------------------------- powers (issue 28)

POWER_VALUES = np.array([-8.0, -2.0, -0.5, -0.0, 0.0, 0.5, 2.0, 8.0, 27.0, -np.inf, np.inf, np.nan])


def _close(got: np.ndarray, want: np.ndarray) -> str:
    """'' where got equals want within 2 units in the last place (the README's exception for the
    C library's functions: NumPy's float32 power is 1 ulp from glibc's powf at 27**(1/3)), NaN,
    +-inf and the sign of every zero equal."""
    special = ~np.isfinite(want) | (want == 0)
    bad = mismatch(got[special], want[special])
    if bad or not np.allclose(got[~special], want[~special], rtol=2 * np.finfo(want.dtype).eps, atol=0):
        return f"{got} != {want} {bad}"
    return ""


def test_powers_as_numpy_computes_them():
    """Fractional powers (issue 28): x**(1/3) is a power, as np.power computes it (NaN for a
    negative base, (-8)**(1/3) included, where cbrt gives -2), x**(-1/2) is 1/sqrt(x) as the NumPy
    module computes it (SymPy's one node for both spellings: -inf at -0.0, where pow gives +inf),
    in the cpu module as in the NumPy module, forward and backward, float64 and float32.  Oracle:
    NumPy evaluating each term (np.power, 1/np.sqrt) in the dtype, and the NumPy module's
    gradient; the power within 2 ulp (a C library function), 1/sqrt bit for bit.  One module:
    each term is read with the other input at a value where that term is 0."""
    text = "x**(1/3) + y**(-1/2)"
    numpy_module, cpu_module = symgrad.load_expr(text), symgrad.load_expr(text, backend="cpu")
    for dtype in (np.float64, np.float32):
        v = POWER_VALUES.astype(dtype)
        for x, y, exact in ((v, np.full_like(v, np.inf), False), (np.zeros_like(v), v, True)):
            with np.errstate(all="ignore"):
                term = 1 / np.sqrt(v) if exact else np.power(v, 1 / 3)
                out, saved = numpy_module.forward(x, y)
                grads = numpy_module.backward(np.ones_like(v), saved)
            out_cpu, saved_cpu = cpu_module.forward(x, y)
            grads_cpu = cpu_module.backward(np.ones_like(v), saved_cpu)
            same = mismatch if exact else _close
            assert not same(out, term + dtype(0)), (dtype, out, term)
            assert not same(out_cpu, out), (dtype, out_cpu, out)
            for g_cpu, g in zip(grads_cpu, grads):
                assert not same(g_cpu, g), (dtype, g_cpu, g)


# ----------------------------------------------------------------------------- float16 without a convention (issue 28)

def _max16(a, b):
    """README (Framework conventions): without a convention max is np.maximum, which in float16
    returns the first of two equal values (+0 and -0 included) and propagates NaN."""
    return np.where(np.isnan(a) | (a >= b), a, b)


def _min16(a, b):
    return np.where(np.isnan(a) | (a <= b), a, b)


def _select16(c, v):
    """A gradient's term: v where its piece wins, +0 elsewhere (README: a sum of selects)."""
    return np.where(c, v, np.float16(0))


def _float16_oracle(op: str, x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) of op under ties='first' (the default) in NumPy's float16 (each
    constant, product and sum rounded to float16), written from the ops' definitions and the
    README: a piece wins a max where it is NaN or not below the other (the first of equals), the
    pieces of leaky_relu and abs compared through x (x >= 0), and the gradient is the sum of the
    winning pieces' terms."""
    nan = np.isnan(x)
    if op == "relu":  # max(0, x)
        return _max16(np.float16(0), x), _select16(nan | (x > 0), g)
    if op == "leaky_relu":  # max(x, 0.01*x)
        slope = np.float16(0.01)
        wins = nan | (x >= 0)
        return _max16(x, slope * x), _select16(wins, g) + _select16(~wins, slope * g)
    if op in ("hardtanh", "clamp"):  # min(max(x, -1), 1)
        inner = _max16(x, np.float16(-1))
        wins = (nan | (x >= -1)) & (np.isnan(inner) | (inner <= 1))
        return _min16(inner, np.float16(1)), _select16(wins, g)
    if op == "abs":  # max(x, -x)
        wins = nan | (x >= 0)
        return _max16(x, -x), _select16(wins, g) + _select16(~wins, -g)
    raise ValueError(op)


@pytest.mark.parametrize("op,params", [("relu", {}), ("leaky_relu", {}), ("hardtanh", {}),
                                       ("clamp", {"min": -1.0, "max": 1.0}), ("abs", {})])
def test_float16_without_a_convention_is_numpy_float16(op, params):
    """Every float16 value (issue 28): without a convention the cpu module computes float16 as the
    NumPy module does (NumPy's float16: the constants and each product and sum rounded to float16,
    np.maximum's first of equal values), so forward, backward and jvp agree bit for bit
    (relu(-0.0) was -0.0 on the cpu backend, +0.0 in NumPy; leaky_relu's backward differed on
    8,624 of these 65,536), and both equal the oracle written from the README."""
    x = np.arange(65536, dtype=np.uint16).view(np.float16)
    g = (np.random.default_rng(0).standard_normal(x.shape) * 4).astype(np.float16)
    g[::7] = -0.0
    numpy_module, cpu_module = symgrad.load(op, **params), symgrad.load(op, backend="cpu", **params)
    with np.errstate(all="ignore"):
        want_y, want_g = _float16_oracle(op, x, g)
        (y, saved), (y_cpu, saved_cpu) = numpy_module.forward(x), cpu_module.forward(x)
        (grad,), (grad_cpu,) = numpy_module.backward(g, saved), cpu_module.backward(g, saved_cpu)
        tangent, tangent_cpu = numpy_module.jvp(g, saved), cpu_module.jvp(g, saved_cpu)
    assert not mismatch(y, want_y) and not mismatch(grad, want_g), (mismatch(y, want_y), mismatch(grad, want_g))
    assert not mismatch(y_cpu, y) and not mismatch(grad_cpu, grad), (mismatch(y_cpu, y), mismatch(grad_cpu, grad))
    assert not mismatch(tangent_cpu, tangent), mismatch(tangent_cpu, tangent)


def test_constant_parts_are_exact_in_the_cpu_module():
    """The cpu module's constants are the exact values rounded once (issue 28), as the NumPy
    module's: Max(x, sin(2*pi)) ties at x = 0 (sin(2*pi) is 0, not -1.7e-34), so under 'last' x's
    gradient is 0 there, and sin(1e308) is sin(10**308).  Oracle: mpmath with 4000 bits, rounded
    once, and the README's 'last' by brute force over the pieces."""
    import mpmath
    with mpmath.workprec(4000):
        zero, s = float(mpmath.sin(2 * mpmath.pi)), float(mpmath.sin(mpmath.mpf(10) ** 308))
    x = np.array([-1.0, -0.0, 0.0, 1e-300, 1.0])
    y = np.array([1.0, -2.0, 0.5, 3.0, 1e-300])
    module = symgrad.load_expr("Max(x, sin(2*pi)) + y*sin(1e308)", ties="last", backend="cpu")
    out, saved = module.forward(x, y)
    gx, gy = module.backward(np.ones_like(x), saved)
    winners = [max(k for k, p in enumerate((xi, zero)) if p == max(xi, zero)) for xi in x]
    assert not mismatch(out, np.maximum(x, zero) + y * s), (out, np.maximum(x, zero) + y * s)
    assert not mismatch(gx, np.array([1.0 if w == 0 else 0.0 for w in winners])), gx
    assert not mismatch(gy, np.full_like(y, s)), gy


@pytest.mark.parametrize("settings", [{"convention": "torch"}, {"convention": "jax"}, {"ties": "last"}],
                         ids=["torch", "jax", "last"])
def test_float16_write_backward_equals_numpy_for_every_half_gradient(settings):
    """The write-form backward (windows that tile the input) makes float16 gradients on the bits,
    with no conversion to float and back per element: every half as grad_output (+-0, subnormals,
    +-inf and every NaN among them) gets the NumPy module's bits, a NaN where it gives a NaN (the
    cpu backend rounds every NaN to the quiet NaN of its sign, as its float16 conversion does)."""
    m = symgrad.load("max_pool2d", backend="cpu", kernel_size=2, **settings)
    reference = symgrad.load("max_pool2d", kernel_size=2, **settings)
    x = np.random.default_rng(0).standard_normal((2, 8, 128, 131)).astype(np.float16)  # 66,560 windows
    x[0, 0, :2, :4] = np.nan
    x[0, 1] = -0.0
    y, saved = m.forward(x, threads=1)
    every = np.arange(2**16, dtype=np.uint16).view(np.float16)
    assert y.size >= every.size
    for shift in (0, 3):  # each half at two window positions
        g = np.roll(np.resize(every, y.shape), shift)
        (got,) = m.backward(g, saved, threads=1)
        (want,) = reference.backward(g, reference.forward(x)[1])
        nan = np.isnan(want)
        assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
        assert np.isnan(got[nan]).all()


@pytest.mark.parametrize("settings", [{"convention": "torch"}, pytest.param({"ties": "split"}, marks=pytest.mark.slow)],
                         ids=["torch-scatter", "split-gather"])
def test_float16_f16c_and_portable_backward_give_the_same_bits(monkeypatch, settings):
    """float16's overlapping-window backward is compiled twice, with F16C's conversions (run where
    the CPU has F16C) and with the portable bit helpers (f16_generic): every half as grad_output
    (every NaN, +-inf, +-0 and subnormal among them, sums that round at each add) gets the same
    bits from both, NaNs included, and the NumPy module's float16 bits off NaN."""
    params = {"kernel_size": 3, "stride": 2, "padding": 1}
    m = symgrad.load("max_pool2d", backend="cpu", **settings, **params)
    reference = symgrad.load("max_pool2d", **settings, **params)
    x = np.random.default_rng(1).integers(0, 3, size=(2, 8, 128, 130)).astype(np.float16)  # ties
    x[0, 0, :2, :4] = np.nan
    y, saved = m.forward(x, threads=1)
    every = np.arange(2**16, dtype=np.uint16).view(np.float16)
    assert y.size >= every.size
    # every half, then every half but the NaNs (the scatter's path for windows adding no NaN
    # gradient: sg_add_fast_f16c), inf - inf among its sums
    finite = np.resize(every[~np.isnan(every)], y.shape)
    finite[1, 0, :, 0::2], finite[1, 0, :, 1::2] = np.inf, -np.inf  # winners shared by +inf and -inf windows
    for g, where in ((np.resize(every, y.shape), ...), (finite, (1, 0))):  # where: a NaN sum is
        (dispatched,) = m.backward(g, saved, threads=1)
        with monkeypatch.context() as patch:
            patch.setitem(m._DTYPES, "float16", "f16_generic")  # the portable kernels by name
            patch.setattr(m, "_functions", {})
            (portable,) = m.backward(g, saved, threads=1)
        assert portable.view(np.uint16).tobytes() == dispatched.view(np.uint16).tobytes()
        with np.errstate(over="ignore", invalid="ignore"):  # 65504 + 65504: inf, inf - inf: NaN, meant so
            (want,) = reference.backward(g, reference.forward(x)[1])
        nan = np.isnan(want)
        assert nan[where].any() and np.array_equal(portable.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
        assert np.isnan(portable[nan]).all()
