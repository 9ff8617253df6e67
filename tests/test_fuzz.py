"""Fuzzing the public surface with hypothesis.

* symgrad.load / derive / generate with random op names, tie policies and parameter values and
  types (negative, zero, huge, floats for ints, wrong tuple lengths, None, strings, bytes, NumPy
  scalars and arrays, Fractions, Decimals, complex, objects);
* the CLI, run in-process on random argument lists (and a sample through a real subprocess);
* modules generated for random float parameters (bounds, slopes), checked at and next to them;
* generated forward/backward with random shapes, ranks, dtypes (floats, ints, bools, complex,
  object, strings, byte-swapped), non-contiguous, broadcast, read-only, zero-size and subclassed
  arrays, a saved value from a different call or module, and grad_output of wrong shapes/dtypes.

Every case either works correctly (checked against tests/oracle.py, and zero-size inputs give
zero-size outputs) or raises exactly ValueError or TypeError with a message that names the
parameter and what was expected; through the CLI, exit status 2 and one line on stderr.

The number of examples per entry point is FUZZ_EXAMPLES (environment variable
SYMGRAD_FUZZ_EXAMPLES, else 2500 in a slow run (`-m slow` or SYMGRAD_SLOW=1) and 600 in the default
run, which must fit CI's 15 minutes on 2 cores).  Examples are derandomized: CI runs the same ones every time.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import random
import re
import shutil
import subprocess
import sys
import warnings
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symgrad
from symgrad.conventions import PRESETS
from oracle import reference, windows_of
from symgrad import cli
from symgrad.ops import OPS
from symgrad.policy import POLICIES

ROOT = Path(__file__).resolve().parents[1]
FUZZ_EXAMPLES = int(os.environ.get("SYMGRAD_FUZZ_EXAMPLES")
                    or (2500 if os.environ.get("SYMGRAD_SLOW") == "1" else 600))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
COUNTS: dict[str, int] = {}  # examples run per entry point (printed with -s)


def _count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    for name, n in sorted(COUNTS.items()):
        print(f"\nfuzz examples run: {name}: {n}")


EXPECTATION = re.compile(r"\b(must|expected|expects|takes|missing|unknown|unexpected|at least|at most|"
                         r"refusing|not a directory|not one)\b")


def assert_clear_error(exc: BaseException, names) -> None:
    """Exactly ValueError or TypeError, one line, naming one of `names` and what was expected."""
    assert type(exc) in (ValueError, TypeError), f"{type(exc).__name__} escaped: {exc}"
    msg = str(exc)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    assert any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", msg) for n in names), \
        f"names none of {sorted(names)}: {msg!r}"
    assert EXPECTATION.search(msg), f"does not say what was expected: {msg!r}"


# ----------------------------------------------------------------------------- parameter values

SPECIAL_OBJECTS = [np.int64(2), np.int8(-1), np.uint64(3), np.float32(0.5), np.float16(2.0), np.bool_(True),
                   Fraction(1, 2), Fraction(3, 1), Decimal("0.5"), complex(1, 0), object(), np.array([2, 2]),
                   np.array(2), (2.0, 2.0), (2, None), [], (), {}, {2}, {"a": 1}, range(2), b"2", "2",
                   "first", float("nan"), float("inf"), -float("inf"), -0.0, 5e-324, 1.7976931348623157e308,
                   None, True, False, -3, -1, 0, 1, 2, 3, 4, (1, 2, 3, 4), [2, 2], [2.0], (0,), (-1, 2),
                   (2, 2**70), ["2"], (None,), "", "a b"]
HUGE = [-(2**63), -(2**31), 2**31 - 1, 2**31, 2**53 + 1, 2**63, 2**64, 10**30, 10**400]
JUNK = SPECIAL_OBJECTS + HUGE

# One draw picks from a pool; a minority of values comes from hypothesis' own floats and text.
junk = st.one_of(st.sampled_from(JUNK), st.sampled_from(JUNK), st.sampled_from(JUNK),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3))

# Plausible values: mostly valid, from small pools, so that the (cached) derivations stay few
FLOATS = [-1.0, -0.5, 0, 0.01, 0.5, 1, 2.0, 6, -0.0, 5e-324, 1e300, -1.7976931348623157e308]
ABSENT = object()  # the parameter is not passed


def _plausible(op: str, p) -> list:
    spec = OPS[op]
    if p.kind == "ints":
        ints = [0, 1, 2, 3] if spec.spatial < 3 else [0, 1, 2]  # 3x3x3 windows cost seconds each
        tuples = [t for n in range(1, spec.spatial + 2) for t in itertools.product(ints, repeat=n)]
        return ints * 4 + tuples
    if p.kind == "int":
        return list(range(7))
    if p.kind == "bool":
        return [True, False]
    if p.kind in ("float", "optfloat"):
        return FLOATS + ([None] if p.kind == "optfloat" else [])
    if p.kind == "dim":
        return [None, -4, -3, -2, -1, 0, 1, 2, 3, (), (0, 1), (1, 0), (-1, 0), (0, 0), (0, 2), (1, 2, 3)]
    if p.kind == "ratios":
        return [None, 0.5, 0.25, 0.99, (0.5, 0.5), (0.3, 0.7, 0.5), 1.0, 0, -0.5, 1e-300]
    raise AssertionError(p.kind)


POOLS = {(op, p.name): st.sampled_from([ABSENT] * 3 + _plausible(op, p) * 2 + JUNK)
         for op, spec in OPS.items() for p in spec.params}
OP_NAMES = st.sampled_from(list(OPS) * 4 + ["RELU", "max_pool4d", "", "relu ", None, 3, b"relu", ("relu",)])
TIES = st.sampled_from([ABSENT] * 8 + list(POLICIES) * 2 + ["First", "max", "", None, 3, b"first"])
EXTRA = st.sampled_from([ABSENT] * 12 + ["kernel_size", "strides", "pieces", "dim", "min", "alpha"])
CONVENTION = st.sampled_from([ABSENT] * 14 + [None, "torch", "jax", 3])
BACKEND = st.sampled_from([ABSENT] * 14 + ["numpy", "cuda", "NumPy", None, 3])


@st.composite
def api_calls(draw):
    """(op, kwargs) with op mostly a real op name, kwargs a random subset of its parameters,
    sometimes with the policy, a backend, a convention or a parameter it does not take."""
    op = draw(OP_NAMES)
    if draw(st.integers(0, 19)) == 0:
        op = draw(junk)
    kwargs = {}
    spec = OPS.get(op) if isinstance(op, str) else None
    for p in spec.params if spec else ():
        v = draw(POOLS[(op, p.name)])
        if v is not ABSENT:
            kwargs[p.name] = v
    for name, strategy in (("ties", TIES), ("convention", CONVENTION), ("backend", BACKEND)):
        v = draw(strategy)
        if v is not ABSENT:
            kwargs[name] = v
    extra = draw(EXTRA)
    if extra is not ABSENT:
        kwargs[extra] = draw(junk)
    return op, kwargs


def _names(op, kwargs) -> set[str]:
    names = set(kwargs) | {"op", "ties", "backend", "convention", "out", "kernel_size", "pieces"}
    if isinstance(op, str) and op in OPS:
        names |= {p.name for p in OPS[op].params}
    return names


def _policy(kwargs) -> str:
    """The tie policy in force: ties= if given, else the convention's preset, else the default."""
    if kwargs.get("ties") is not None:
        return kwargs["ties"]
    if kwargs.get("convention") is not None:
        return PRESETS[kwargs["convention"]][kwargs["_op"]].ties
    return OPS[kwargs["_op"]].policies[0] if OPS[kwargs["_op"]].policies else "first"  # the op's own default


@pytest.mark.parametrize("entry", ["load", "derive", "generate"])
def test_fuzz_api(entry, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"fuzz-{entry}")

    @FUZZ
    @given(call=api_calls())
    def run(call):
        op, kwargs = call
        _count(entry)
        try:
            if entry == "generate":
                result = symgrad.generate(op, out, **kwargs)
            else:
                result = getattr(symgrad, entry)(op, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the point: nothing but ValueError/TypeError
            assert_clear_error(exc, _names(op, kwargs))
            return
        ties = _policy({**kwargs, "_op": op})
        if entry == "load":
            assert result.OP == op and result.TIES == ties
            assert callable(result.forward) and callable(result.backward)
        elif entry == "derive":
            assert result.op.name == op and result.op.ties == ties and result.steps
        else:
            text = result.read_text(encoding="utf-8")
            suffix = "_cuda.py" if kwargs.get("backend") == "cuda" else ".py"  # the CuPy loader
            assert result.parent == out and result.name.startswith(op) and result.name.endswith(suffix)
            assert text.startswith("# Generated by symgrad") and f"# tie policy: {ties} (" in text
            compile(text, str(result), "exec")  # complete, not a part

    run()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], "temporary files left behind"


# ----------------------------------------------------------------------------- the CLI

VALUES = ["0", "1", "2", "3", "-1", "2.5", "0.01", "nan", "inf", "-inf", "1e999", "none", "None", "abc",
          "", "99999999999999999999", "2147483648", "0x10", "1_0", "-", "é", "1e-320", "-0.0"]
OP_FLAGS = sorted({"--" + p.name.replace("_", "-") for s in OPS.values() for p in s.params})
FLAGS = OP_FLAGS + ["--ties", "--full", "--out", "--check", "--force", "--catalog", "--backend",
                    "--bogus", "-x", "--help", "--version"]


def _flag_groups(outs: list[str]) -> list[tuple[str, ...]]:
    """A flag with 0-3 values each; drawn whole, so an argument list costs few draws."""
    rng = random.Random(8)
    groups: list[tuple[str, ...]] = [(f,) for f in FLAGS]
    groups += [("--out", o) for o in outs] * 3
    groups += [("--ties", t) for t in list(POLICIES) * 3 + ["random", ""]]
    groups += [("--backend", b) for b in ("numpy", "cuda", "")]
    sizes = ["1", "2", "0", "-1", "2.5", "abc", "4096", "2147483648"]  # small sizes keep derivations cheap
    for flag in ("--kernel-size", "--stride", "--padding", "--dilation"):
        groups += [(flag,) + tuple(rng.choices(sizes, k=rng.randint(1, 4))) for _ in range(30)]
    for flag in OP_FLAGS:
        groups += [(flag,) + tuple(rng.choices(VALUES, k=rng.randint(1, 3))) for _ in range(12)]
    return groups


def argvs(outs: list[str]) -> st.SearchStrategy:
    verbs = st.sampled_from(["derive", "derive", "generate", "generate", "list", "cache", "frobnicate"])
    ops = st.sampled_from(list(OPS) * 2 + ["softmax", "RELU", "", "--", "-", "info", "clear"])
    groups = st.lists(st.sampled_from(_flag_groups(outs)), max_size=5)

    @st.composite
    def build(draw):
        verb = draw(verbs)
        head = [verb] + ([draw(ops)] if draw(st.integers(0, 5)) else [])
        if verb == "cache":
            head = [verb, draw(st.sampled_from(["info", "info", "clear", "bogus"]))]
        return head + [a for g in draw(groups) for a in g]

    return build()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # --help and --version exit through argparse
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def assert_cli_contract(argv, rc, stdout, stderr) -> None:
    assert "Traceback" not in stdout + stderr, (argv, stderr)
    if rc == 2:
        lines = stderr.splitlines()
        assert stdout == "", (argv, stdout[:300])
        assert len(lines) == 1 and lines[0].startswith("symgrad: error: ") and len(lines[0]) > 16, \
            (argv, stderr)
    elif rc == 1:  # --check found something stale: a diff on stdout, one line on stderr
        assert "--check" in argv, (argv, stderr)
        assert len(stderr.splitlines()) == 1, (argv, stderr)
    else:
        assert rc == 0, (argv, rc, stderr)


FOREIGN = "# my own relu, not generated\n"


def _sandbox(root: Path) -> list[str]:
    """--out targets: missing, empty, nested-missing, a regular file, a directory holding a
    foreign file of the name symgrad would write, a path through a file, an unwritable place."""
    (root / "empty").mkdir()
    (root / "a_file").write_text("keep me\n", encoding="utf-8")
    (root / "foreign").mkdir()
    (root / "foreign" / "relu_first.py").write_text(FOREIGN, encoding="utf-8")
    return [str(root / n) for n in ("missing", "empty", "new/nested", "a_file", "foreign", "a_file/sub")] + \
        ["/proc/symgrad-fuzz"]


_CHECKED: set = set()  # (path, mtime, size) of generated files already found complete


def _check_sandbox(root: Path, argv) -> None:
    assert (root / "a_file").read_text(encoding="utf-8") == "keep me\n"
    foreign = (root / "foreign" / "relu_first.py").read_text(encoding="utf-8")
    assert foreign == FOREIGN or "--force" in argv
    if foreign != FOREIGN:
        (root / "foreign" / "relu_first.py").write_text(FOREIGN, encoding="utf-8")
    for p in root.rglob("*"):
        assert not p.name.endswith(".tmp"), f"temporary file left: {p}"
        if p.suffix == ".py" and p != root / "foreign" / "relu_first.py":
            st_ = p.stat()
            if (p, st_.st_mtime_ns, st_.st_size) in _CHECKED:
                continue
            text = p.read_text(encoding="utf-8")
            assert text.startswith("# Generated by symgrad"), p
            compile(text, str(p), "exec")
            _CHECKED.add((p, st_.st_mtime_ns, st_.st_size))


def test_fuzz_cli(tmp_path, monkeypatch):
    """In-process `symgrad ...` on random argument lists: exit 0, 1 (--check, stale) or 2 with one
    `symgrad: error:` line; never a traceback; --out never gets a partial or foreign-clobbering
    write; nothing is written outside the sandbox (the working directory is the sandbox)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    outs = _sandbox(tmp_path)

    @FUZZ
    @given(argv=argvs(outs))
    def run(argv):
        _count("cli")
        rc, stdout, stderr = run_cli(argv)
        assert_cli_contract(argv, rc, stdout, stderr)
        _check_sandbox(tmp_path, argv)

    run()


def test_cli_sample_through_subprocesses(tmp_path):
    """A sample of the same argument lists through the real entry point: the same exit status,
    and for errors the same one line, as in-process."""
    outs = _sandbox(tmp_path)
    rng = random.Random(8)
    samples = []
    while len(samples) < 6:
        verb = rng.choice(["derive", "generate", "cache", "list", "frobnicate"])
        argv = [verb] + ([rng.choice(["info", "bogus"])] if verb == "cache" else
                         [rng.choice(list(OPS) + ["softmax"])])
        for _ in range(rng.randint(0, 3)):
            flag = rng.choice([f for f in FLAGS if f not in ("--help", "--version")])
            argv.append(flag)
            if flag == "--out":
                argv.append(rng.choice(outs))
            elif flag in OP_FLAGS or flag in ("--ties", "--backend"):
                argv.append(rng.choice(VALUES + list(POLICIES)))
        if "max_pool3d" in argv:
            continue
        samples.append(argv)
    env = dict(os.environ, SYMGRAD_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    from concurrent.futures import ThreadPoolExecutor

    def real(argv):
        return subprocess.run([sys.executable, "-m", "symgrad", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        results = list(pool.map(real, samples))
    for argv, r in zip(samples, results):
        assert_cli_contract(argv, r.returncode, r.stdout, r.stderr)
        if r.returncode == 2:
            rc, _, stderr = run_cli(argv)
            assert (rc, stderr) == (2, r.stderr), argv


# ----------------------------------------------------------------------------- generated code

# (op, ties, params): every template and both selection forms
MODULES = [
    ("relu", "first", {}),
    ("maximum", "split", {}),
    ("minimum", "last", {}),
    ("clamp", "last", {"min": -1.0, "max": 1.0}),
    ("leaky_relu", "all", {"negative_slope": 0.25}),
    ("abs", "split", {}),
    ("max_pool1d", "first", {"kernel_size": 2, "stride": 1, "padding": 1}),
    ("max_pool2d", "split", {"kernel_size": 2}),
    ("max_pool2d", "last", {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("max_pool3d", "all", {"kernel_size": 2}),
    ("maxout", "first", {"pieces": 2}),
    ("maxout", "split", {"pieces": 3}),
    ("adaptive_max_pool1d", "first", {"output_size": 3}),
    ("adaptive_max_pool2d", "split", {"output_size": (None, 2)}),
    ("amax", "first", {"dim": 1}),
    ("amin", "split", {"dim": (0, 2), "keepdim": True}),
    ("amax", "all", {}),
    ("amin", "last", {"dim": -1}),
]

FLOAT_DTYPES = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(">f8"),
                np.dtype("<f4")]
BAD_DTYPES = [np.dtype(t) for t in (np.int64, np.int8, np.uint8, np.bool_, np.complex64, np.complex128,
                                    object, "U2", "S1", "datetime64[s]", np.longdouble)]
VALUES_POOL = np.array([0.0, -0.0, 1.0, 1.0, 2.0, -1.0, 0.5, np.nan, np.inf, -np.inf, 6.0, 3.0])


def _validity(op: str, params: dict, shapes: list[tuple]) -> str | None:
    """Why these input shapes are invalid for the op (None: valid), from the op's definition."""
    if op in ("maximum", "minimum"):
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            return "broadcast"
        return None
    if op in ("relu", "clamp", "leaky_relu", "abs"):
        return None
    (shape,) = shapes
    if op.startswith("adaptive_max_pool"):
        d = int(op[17])
        if len(shape) not in (d + 1, d + 2):
            return "dims"
        if any(n == 0 for n in shape[-d - 1:]):
            return "shape"
        return None
    if op.startswith("max_pool"):
        d = int(op[8])
        if len(shape) not in (d + 1, d + 2):
            return "dims"
        if any(n == 0 for n in shape[-d - 1:]):
            return "shape"
        out_shape, windows = windows_of(op, params, shape)
        if any(n < 1 for n in out_shape[-d:]):
            return "too small"
        if any(all(e is None for e in elems) for elems in windows.values()):
            return "only padding"
        return None
    if op == "maxout":
        if len(shape) < 2:
            return "dims"
        if shape[1] == 0 or shape[1] % params["pieces"]:
            return "pieces"
        return None
    rank = len(shape)
    dims = params.get("dim")
    dims = tuple(range(rank)) if dims is None else (dims if isinstance(dims, tuple) else (dims,))
    if any(not -max(rank, 1) <= d < max(rank, 1) for d in dims):
        return "dim"
    if rank and math.prod(shape[d % rank] for d in dims) == 0:
        return "size 0"
    return None


@st.composite
def arrays(draw, dtype_choices, ranks, shape=None):
    """An array of a random shape (zero sizes included) or the given one, dtype and memory layout."""
    if shape is None:
        rank = draw(ranks)
        shape = tuple(draw(st.lists(st.sampled_from([0, 1, 1, 2, 2, 3, 4]), min_size=rank, max_size=rank)))
        if math.prod(shape) > 256:
            shape = shape[:2]
    dtype = draw(st.sampled_from(dtype_choices))
    seed = draw(st.integers(0, 2**32 - 1))
    base = np.asarray(np.random.default_rng(seed).choice(VALUES_POOL, size=shape))
    with np.errstate(invalid="ignore", over="ignore"):
        if dtype.kind in "US":
            x = base.astype(dtype)
        elif dtype.kind in "iub":
            x = np.nan_to_num(base, posinf=9, neginf=-9).astype(dtype)
        elif dtype.kind == "M":
            x = np.zeros(shape, dtype=dtype)
        else:
            x = base.astype(dtype)
    x = np.asarray(x)
    layout = draw(st.sampled_from(["contiguous", "fortran", "reversed", "strided", "broadcast",
                                   "readonly", "matrix", "list", "scalar"]))
    if layout == "fortran":
        x = np.asfortranarray(x)
    elif layout == "reversed" and x.ndim:
        x = x[..., ::-1]
    elif layout == "strided" and x.ndim:
        x = np.repeat(x, 2, axis=-1)[..., ::2]  # same values, every other element of a copy
    elif layout == "broadcast" and x.ndim:
        x = np.broadcast_to(x[..., :1], x.shape)  # stride 0 on the last axis
    elif layout == "readonly":
        x = x.copy()
        x.flags.writeable = False
    elif layout == "matrix" and x.ndim == 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            x = np.asmatrix(x)
    elif layout == "list" and x.dtype.kind == "f" and x.dtype.isnative:
        x = x.tolist()
    elif layout == "scalar" and x.ndim == 0 and x.dtype.kind == "f":
        x = x.dtype.type(x)
    return x


SAMPLE_SHAPES = {"max_pool1d": (2, 3, 5), "max_pool2d": (2, 2, 4, 5), "max_pool3d": (1, 2, 2, 3, 4),
                 "adaptive_max_pool1d": (2, 3, 5), "adaptive_max_pool2d": (2, 2, 4, 5),
                 "maxout": (2, 6, 3), "amax": (3, 4, 2), "amin": (3, 4, 2)}


@pytest.fixture(scope="module")
def modules():
    """(op, ties, params, module, the Saved of one valid forward call) of every module."""
    out = []
    for op, ties, params in MODULES:
        m = symgrad.load(op, ties=ties, **params)
        x = np.ones(SAMPLE_SHAPES.get(op, (3, 4)))
        out.append((op, ties, params, m, m.forward(*[x] * len(getattr(m, "INPUTS", ("x",))))[1]))
    return out


def _close(got, want, dtype, what):
    got = np.asarray(got, dtype=np.float64)
    eps = float(np.finfo(dtype).eps)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    with np.errstate(over="ignore"):
        want = want.astype(dtype).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=8 * eps, atol=8 * eps, err_msg=what)


@st.composite
def grad_variants(draw):
    return draw(st.sampled_from(["right", "right", "right", "other-float", "noncontiguous", "list",
                                 "extra-dim", "missing-dim", "off-by-one", "int", "complex", "none",
                                 "other-call", "other-module", "tuple-saved", "none-saved"]))


def test_fuzz_forward_backward(modules):
    @FUZZ
    @given(which=st.integers(0, len(MODULES) - 1), data=st.data(), variant=grad_variants())
    def run(which, data, variant):
        op, ties, params, m, _ = modules[which]
        n_inputs = len(getattr(m, "INPUTS", ("x",)))
        dtype_choices = FLOAT_DTYPES * 5 + BAD_DTYPES
        # half the time a rank the op takes, so that backward gets its share of examples
        usual = {"max_pool1d": [2, 3], "max_pool2d": [3, 4], "max_pool3d": [4, 5], "maxout": [2, 3, 4],
                 "amin": [3, 4], "adaptive_max_pool1d": [2, 3], "adaptive_max_pool2d": [3, 4]}.get(op, [0, 1, 2, 3])
        ranks = st.one_of(st.sampled_from(usual), st.integers(0, 4 if n_inputs == 2 else 5))
        inputs = [data.draw(arrays(dtype_choices, ranks)) for _ in range(n_inputs)]
        _count("forward")
        names = list(getattr(m, "INPUTS", ("x",)))
        arrs = [np.asarray(x) for x in inputs]
        bad_dtype = next((n for n, a in zip(names, arrs) if a.dtype.type not in (np.float16, np.float32, np.float64)),
                         None)
        why = None if bad_dtype else _validity(op, params, [a.shape for a in arrs])
        try:
            with np.errstate(all="ignore"):
                y, saved = m.forward(*inputs)
        except Exception as exc:  # noqa: BLE001
            assert bad_dtype or why, f"{op} refused valid input {[a.shape for a in arrs]}: {exc!r}"
            assert_clear_error(exc, names + ["inputs"])
            if bad_dtype:
                assert type(exc) is TypeError and "float16, float32 or float64" in str(exc)
            # backward still gets this example: on a valid input of random dtype and layout
            shape = SAMPLE_SHAPES.get(op, (3, 4))
            inputs = [data.draw(arrays(FLOAT_DTYPES, None, shape=shape)) for _ in range(n_inputs)]
            arrs = [np.asarray(x) for x in inputs]
            bad_dtype = why = None
            with np.errstate(all="ignore"):
                y, saved = m.forward(*inputs)
        assert bad_dtype is None and why is None, f"{op} accepted {why or bad_dtype}: {[a.shape for a in arrs]}"
        dtype = np.result_type(*arrs)
        assert type(y) is np.ndarray and y.dtype.type == dtype.type  # (any byte order)
        g = (1 + np.arange(y.size) % 3).reshape(y.shape).astype(dtype)
        want_y, want_grads = reference(op, params, ties, [a.astype(np.float64) for a in arrs], g)
        if y.size == 0 or any(a.size == 0 for a in arrs):
            assert y.size == 0
        _close(y, want_y, dtype, "output")

        # backward, with a good or a bad grad_output / saved
        _count("backward")
        expect = None  # None: works; else (exception type, names)
        if variant == "other-float":
            g = g.astype(np.float32 if dtype != np.float32 else np.float64)
        elif variant == "noncontiguous" and g.ndim:
            g = np.repeat(g, 2, axis=-1)[..., ::2]
        elif variant == "list":
            g = g.tolist()
            if np.shape(g) != y.shape:  # a list cannot hold an empty shape such as (0, 3)
                expect = (ValueError, ["grad_output"])
        elif variant == "extra-dim":
            g, expect = g[..., None], (ValueError, ["grad_output"])
        elif variant == "missing-dim" and g.ndim:
            g, expect = np.ones(g.shape[:-1], dtype=dtype), (ValueError, ["grad_output"])
        elif variant == "off-by-one" and g.ndim:
            g, expect = np.ones(g.shape[:-1] + (g.shape[-1] + 1,), dtype=dtype), (ValueError, ["grad_output"])
        elif variant == "int":
            g, expect = g.astype(np.int64), (TypeError, ["grad_output"])
        elif variant == "complex":
            g, expect = g.astype(np.complex128), (TypeError, ["grad_output"])
        elif variant == "none":
            g, expect = None, (TypeError, ["grad_output"])
        elif variant == "other-module":
            saved = modules[(which + 1) % len(modules)][4]
            expect = (TypeError, ["saved"])
        elif variant == "tuple-saved":
            saved, expect = tuple(saved), (TypeError, ["saved"])
        elif variant == "none-saved":
            saved, expect = None, (TypeError, ["saved"])
        elif variant == "other-call":
            # the saved value of another forward of this module: a gradient for that call, or a
            # clear error when grad_output does not fit it
            other_inputs = [a[..., :1] if a.ndim else a for a in arrs]
            try:
                with np.errstate(all="ignore"):
                    y2, saved = m.forward(*other_inputs)
            except (ValueError, TypeError):
                return
            if y2.shape == np.shape(g):
                want_y, want_grads = reference(op, params, ties, [a.astype(np.float64) for a in other_inputs], g)
                arrs = other_inputs
            else:
                expect = (ValueError, ["grad_output"])
        try:
            with np.errstate(all="ignore"):
                grads = m.backward(g, saved)
        except Exception as exc:  # noqa: BLE001
            assert expect, f"{op} backward refused ({variant}): {exc!r}"
            assert type(exc) is expect[0], exc
            assert_clear_error(exc, expect[1])
            return
        assert expect is None, f"{op} backward accepted {variant}"
        assert isinstance(grads, tuple) and len(grads) == len(arrs)
        for k, (gx, want, a) in enumerate(zip(grads, want_grads, arrs)):
            assert type(gx) is np.ndarray and gx.shape == a.shape and gx.dtype.type == a.dtype.type, \
                (k, gx.shape, gx.dtype, a.shape, a.dtype)
            _close(gx, want, a.dtype, f"gradient {k}")

    run()


# ----------------------------------------------------------------------------- parameter values

@st.composite
def float_params(draw):
    """An elementwise op with random finite bounds or slope (subnormals, huge, ints included)."""
    number = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                       st.integers(-(2**53), 2**53), st.sampled_from([0.1, 1 / 3, -0.0, 5e-324, 2.0**-1022]))
    op = draw(st.sampled_from(["clamp", "hardtanh", "leaky_relu"]))
    if op == "leaky_relu":
        params = {"negative_slope": draw(number)}
    else:
        lo, hi = draw(number), draw(number)
        if op == "hardtanh":
            lo, hi = min(lo, hi), max(lo, hi)
            params = {"min_val": lo, "max_val": hi}
        else:
            params = draw(st.sampled_from([{"min": lo, "max": hi}, {"min": lo}, {"max": hi}]))
    return op, params, draw(st.sampled_from(POLICIES))


def test_fuzz_parameter_values_compute_correctly():
    """Modules generated for random parameter values compute the documented result exactly at
    and next to those values (every literal round-trips into the code), in float64."""
    @settings(FUZZ, max_examples=max(50, FUZZ_EXAMPLES // 16))
    @given(case=float_params())
    def run(case):
        op, params, ties = case
        _count("load (computed)")
        m = symgrad.load(op, ties=ties, **params)
        values = [float(v) for v in params.values() if v is not None]
        with np.errstate(over="ignore"):  # the neighbour of the largest finite value is inf
            near = [np.nextafter(v, s) for v in values for s in (-np.inf, np.inf)]
        x = np.array(sorted({*values, *near, 0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan}, key=repr))
        with np.errstate(all="ignore"):
            y, saved = m.forward(x)
            (gx,) = m.backward(np.ones_like(y), saved)
        want_y, (want_g,) = reference(op, params, ties, [x], np.ones_like(y))
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_allclose(gx, want_g, rtol=1e-15, atol=0)

    run()


# ----------------------------------------------------------------------------- forged saved values

CPU_COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                     if shutil.which(c)), None) or os.environ.get("CI")  # required under CI

SAVED_OPS = [
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, [(2, 3, 7, 6)]),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "split"}, [(2, 3, 7, 6)]),
    ("max_pool1d", {"kernel_size": 3, "stride": 1, "padding": 1, "convention": "jax"}, [(2, 3, 9)]),
    ("max_pool1d", {"kernel_size": 5, "stride": 2, "padding": 2}, [(2, 3, 11)]),  # the scatter path
    ("adaptive_max_pool2d", {"output_size": (3, 4)}, [(2, 3, 7, 6)]),
    ("adaptive_max_pool2d", {"output_size": (3, 4), "ties": "split"}, [(2, 3, 7, 6)]),
    ("maxout", {"pieces": 2}, [(2, 4, 3)]),
    ("amax", {"dim": 1}, [(3, 4, 5)]),
    ("amax", {"dim": 1, "ties": "split"}, [(3, 4, 5)]),
    ("maximum", {}, [(3, 4), (4,)]),
    ("relu", {"ties": "split"}, [(3, 4)]),
    ("max_unpool2d", {"kernel_size": 2}, None),
    ("max_unpool2d", {"kernel_size": 2, "ties": "all"}, None),
    ("logsumexp", {"dim": -1}, [(3, 4)]),
    ("fractional_max_pool2d", {"kernel_size": 2, "output_size": (3, 4)}, [(2, 3, 7, 6), (2, 3, 2)]),
    ("fractional_max_pool2d", {"kernel_size": 2, "output_size": (3, 4), "ties": "split"},
     [(2, 3, 7, 6), (2, 3, 2)]),
]


def _saved_mutations(saved, rng):
    """Every field of saved replaced by values of the wrong type, dtype, shape or range, and every
    pair of fields swapped."""
    fields = saved._fields
    for i, name in enumerate(fields):
        v = saved[i]
        values = [None, 1, "x", [1, 2], (1 << 40,), (), (2,) * 40, np.float32, np.dtype("int8"),
                  np.dtype(np.float64), np.ones((1,) * 33),
                  # values whose repr has newlines or is long (in a message: one line, always)
                  np.zeros((2, 2)), np.zeros((3, 3), np.int64), [np.zeros((2, 2))], "a\nb" * 100,
                  tuple(range(1000)), {"k": np.zeros((2, 2))}]
        if isinstance(v, np.ndarray):
            values += [v.astype(np.int64), v.astype(np.float64), v.astype(np.float16), v.astype(bool),
                       v.astype(object), v[..., :1], v.reshape(-1), v[None]]
            if v.dtype.kind in "ui":
                values += [np.full_like(v, np.iinfo(v.dtype).max), v.astype(np.int64) - 300]
                values += [rng.integers(0, 9, size=v.shape).astype(v.dtype) for _ in range(4)]
            else:
                values += [v * np.nan]
        if isinstance(v, tuple):
            values += [v + (1,), v[:-1], tuple(n + 1 for n in v), tuple(n * 1000 for n in v),
                       (1 << 43,) + v[1:], (1 << 40,) + v, (4,) + v, tuple(-n for n in v),
                       tuple(float(n) for n in v), list(v),
                       (2**40,) * len(v), (True,) * len(v)]
        for value in values:
            yield name, saved._replace(**{name: value})
    for a, b in itertools.permutations(range(len(fields)), 2):
        yield f"{fields[a]}<->{fields[b]}", saved._replace(**{fields[a]: saved[b], fields[b]: saved[a]})


# the cpu backend: a module of each loader template (each compiles on first use, 2-3 s)
CPU_SAVED = ("max_pool2d", "adaptive_max_pool2d", "maxout", "amax", "maximum", "max_unpool2d", "logsumexp",
             "fractional_max_pool2d")
SAVED_CASES = [c + ("numpy",) for c in SAVED_OPS] + [
    next(c for c in SAVED_OPS if c[0] == op) + ("cpu",) for op in CPU_SAVED]


@pytest.mark.parametrize("op,params,shapes,backend", SAVED_CASES,
                         ids=[f"{o}-{p.get('ties', p.get('convention', 'default'))}-{b}" for o, p, _, b in SAVED_CASES])
def test_fuzz_forged_saved_values(op, params, shapes, backend):
    """A forged or mutated saved value: backward and jvp raise TypeError or ValueError (naming a
    saved field, in one line: a forged array's repr put newlines in it) or compute, and nothing
    allocates more than a few MiB; in the NumPy module and the cpu backend's loader."""
    import tracemalloc
    if backend == "cpu" and not CPU_COMPILER:
        pytest.skip("no C compiler for the cpu backend")
    m = symgrad.load(op, backend=backend, **params)
    rng = np.random.default_rng(16)
    if shapes is None:  # unpooling: values and their indices
        xs = [rng.normal(size=(2, 3, 2, 2)), rng.integers(0, 16, size=(2, 3, 2, 2))]
    else:
        xs = [rng.integers(-2, 3, size=s).astype(np.float32) for s in shapes]
    constant = OPS[op].constant_inputs  # fractional pooling's samples, in [0, 1), no tangent
    xs = [rng.random(x.shape).astype(x.dtype) if name in constant else x for name, x in zip(OPS[op].inputs, xs)]
    y, saved = m.forward(*xs)
    g = np.ones_like(y)
    tangents = [x if x.dtype.kind == "f" and name not in constant else None for name, x in zip(OPS[op].inputs, xs)]
    escapes = []
    tracemalloc.start()
    try:
        for name, forged in _saved_mutations(saved, rng):
            for call in (lambda: m.backward(g, forged), lambda: m.jvp(*tangents, forged)):
                try:
                    call()
                except (TypeError, ValueError) as exc:
                    assert "saved" in str(exc) or "tangent" in str(exc) or "grad_output" in str(exc), str(exc)
                    if "\n" in str(exc) or len(str(exc)) > 500:
                        escapes.append(f"{name}: not one short line: {str(exc)[:300]!r}")
                except Exception as exc:  # noqa: BLE001 - the point of the test
                    escapes.append(f"{name}: {type(exc).__name__}: {exc}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not escapes, escapes[:5]
    assert peak < 16 * 2**20, peak


# ----------------------------------------------------------------------------- expressions

EXPR_EXAMPLES = int(os.environ.get("SYMGRAD_FUZZ_EXPR_EXAMPLES", "120"))
EXPR_LEAVES = ["x", "y", "z", "0", "1", "2", "0.5", "-1", "1/3", "10**29", "1e308", "pi", "E"]
EXPR_CALLS = ["exp", "log", "sqrt", "tanh", "sin", "atan", "sigmoid", "Abs", "relu", "Heaviside", "sign"]


@st.composite
def small_expressions(draw, depth=3):
    """Small expressions of every construct, constants included (Heaviside(1), sign(2),
    exp(10**29), 1e308*1e308, Piecewise with constant conditions, repeated pieces)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(EXPR_LEAVES))
    sub = small_expressions(depth - 1)
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return f"({draw(sub)}) {draw(st.sampled_from('+-*/'))} ({draw(sub)})"
    if kind == 1:
        return f"({draw(sub)})**({draw(st.sampled_from(['2', '3', '-1', '0.5', '1/3']))})"
    if kind in (2, 3):
        return f"{draw(st.sampled_from(EXPR_CALLS))}({draw(sub)})"
    if kind == 4:
        a = draw(sub)
        args = [a] + [draw(st.sampled_from([a, draw(sub)])) for _ in range(draw(st.integers(1, 3)))]
        return f"{draw(st.sampled_from(['Max', 'Min']))}({', '.join(args)})"
    return f"Piecewise(({draw(sub)}, {draw(sub)} < {draw(sub)}), ({draw(sub)}, True))"


@settings(max_examples=EXPR_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(text=small_expressions(), ties=st.sampled_from(list(POLICIES)))
def test_fuzz_expressions_only_value_and_type_errors_escape(text, ties):
    """Every small expression either generates NumPy and CUDA code whose NumPy forward and
    backward run (on ties, zeros, negatives) or is refused with one ValueError/TypeError line;
    no AssertionError, printer error, OverflowError or Python int reaches the generated code."""
    import types

    from symgrad import expr as _expr
    from symgrad import backends, pipeline
    _count("expressions")
    try:
        op, _ = _expr.make_op(text, ties=ties)
    except (ValueError, TypeError) as exc:
        assert "\n" not in str(exc), str(exc)
        return
    files = pipeline.render(op, backends.get("numpy"))
    pipeline.render(op, backends.get("cuda"))
    source = next(v for k, v in files.items() if k.endswith(".py"))
    module = types.ModuleType("fuzzed_expression")
    exec(compile(source, "fuzzed_expression", "exec"), module.__dict__)
    values = np.array([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in (np.float64, np.float32):
            args = [values.astype(dtype) for _ in module.INPUTS]
            out, saved = module.forward(*args)
            assert out.dtype == dtype
            grads = module.backward(np.ones_like(out), saved)
            assert all(g.dtype == dtype for g in grads)


def test_reserved_names_are_refused_for_every_backend(tmp_path):
    """Every name of the one reserved list (naming.RESERVED, per backend) is refused as an input
    name, by load_expr for each backend and by the CLI (exit 2, one line), before any code."""
    from symgrad import naming
    for backend, names in naming.RESERVED_BY_BACKEND.items():
        for name in sorted(names):
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
                continue
            with pytest.raises(ValueError, match=re.escape(repr(name))):
                symgrad.load_expr(f"Max({name}, q) + q", inputs=[name, "q"], backend=backend)
    for name in ("output_shape", "constexpr", "xor", "NULL", "unix", "CHAR_BIT", "SYMGRAD_STORAGE_TYPES"):
        rc, out, err = run_cli(["generate", "--expr", f"Max({name}, q)", "--name", "r", "--backend", "all",
                                "--out", str(tmp_path)])
        assert rc == 2 and err.count("\n") == 1 and name in err, err
    assert not list(tmp_path.iterdir())


def test_no_accepted_name_is_a_macro_of_the_cuda_compiler(tmp_path):
    """The preprocessor of nvcc, run on a generated .cu, defines no macro that an input may be
    named (``unix`` is 1 there, ``CHAR_BIT`` 8); and a kernel whose inputs are accepted names
    that look like C/CUDA identifiers compiles."""
    import shutil
    from symgrad import expr as _expr
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    symgrad.generate_expr("Max(x, y)", tmp_path, name="m", backend="cuda")
    cu = next(tmp_path.glob("m_*.cu"))
    r = subprocess.run([nvcc, "-E", "-Xcompiler", "-dM", str(cu)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    macros = set(re.findall(r"^#define ([A-Za-z][A-Za-z0-9_]*)", r.stdout, flags=re.M))
    accepted = []
    for name in sorted(macros):
        try:
            _expr.check_name(name)
            accepted.append(name)
        except ValueError:
            pass
    assert not accepted, accepted[:20]
    names = ["size_t", "float4", "atomicAdd", "printf", "malloc", "std", "errno", "Null", "xor_",
             "int8_t", "uint", "half2", "real", "idx", "value_type", "scalar_t"]
    for k in range(0, len(names), 8):
        group = names[k:k + 8]
        symgrad.generate_expr(f"Max({', '.join(group)}) + {' * '.join(group)}", tmp_path,
                              name=f"n{k}", backend="cuda")
        source = next(tmp_path.glob(f"n{k}_*.cu"))
        r = subprocess.run([nvcc, "--fatbin", "-gencode=arch=compute_80,code=sm_80", "-Werror",
                            "all-warnings", str(source), "-o", str(tmp_path / f"n{k}.fatbin")],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
