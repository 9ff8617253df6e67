"""Run the generated CUDA kernels on the CPU, and a stand-in for CuPy that uses them.

The CPU execution harness compiles a generated .cu file, unchanged, with the host C++ compiler
through ``compat.h`` (``__global__``/``__device__`` become plain functions; ``threadIdx``,
``blockIdx``, ``blockDim``, ``gridDim`` become variables; the bit-cast intrinsics become
``memcpy``).  For every ``extern "C" __global__`` kernel it adds a launcher that runs the launch
grid serially: for each block and each thread it sets the index variables and calls the kernel.
The shared object is loaded with ctypes.  Several .cu files share one translation unit
(``build_many``), each in a namespace of its own with its kernels' ``extern "C"`` dropped (the
launchers are the extern "C" functions).  Arguments are checked against the kernel's C signature
(array dtype against the pointer's element type, NumPy scalar type against the scalar type), so
a loader that passes the wrong type fails here as it would misbehave on a GPU.

``fake_cupy`` is a module with the small part of CuPy's API that the generated loaders use:
NumPy arrays stand in for device arrays and ``RawModule`` compiles its code with this harness.
With it the generated loader modules run end to end on the CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COMPAT = Path(__file__).resolve().with_name("compat.h")
CXXFLAGS = ("-std=c++17", "-O0", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
            "-Wall", "-Wno-unused-function", "-Wno-unknown-pragmas", "-Werror",
            # e.g. -fsanitize=address (then run python with LD_PRELOAD=$(g++ -print-file-name=libasan.so))
            *os.environ.get("SYMGRAD_HARNESS_CXXFLAGS", "").split())

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)
_SCALARS = {"int": (np.int32, ctypes.c_int32), "long long": (np.int64, ctypes.c_int64),
            "unsigned int": (np.uint32, ctypes.c_uint32),
            "unsigned long long": (np.uint64, ctypes.c_uint64)}
_ELEMENTS = {"float": ("float32",), "double": ("float64",), "sg_half": ("float16",),
             "sg_bfloat16": ("bfloat16", "uint16"),  # bfloat16 arrays, or their bits as uint16
             "unsigned char": ("uint8",), "unsigned short": ("uint16",), "unsigned int": ("uint32",),
             "unsigned long long": ("uint64",), "long long": ("int64",), "int": ("int32",)}


def find_cxx() -> str | None:
    for name in filter(None, (os.environ.get("CXX"), "g++", "clang++", "c++")):
        path = shutil.which(name)
        if path:
            return path
    return None


def find_nvcc() -> str | None:
    return shutil.which(os.environ.get("NVCC", "nvcc"))


@dataclass(frozen=True)
class Param:
    declaration: str  # as written in the .cu
    name: str
    base: str  # the C type without const, __restrict__ and *
    pointer: bool


def parse_param(text: str) -> Param:
    text = " ".join(text.split())
    m = re.fullmatch(r"(.*?)(\w+)", text)
    if not m:
        raise ValueError(f"cannot parse kernel parameter {text!r}")
    ctype, name = m.group(1), m.group(2)
    pointer = "*" in ctype
    base = " ".join(w for w in ctype.replace("*", " ").split() if w not in ("const", "__restrict__"))
    return Param(text, name, base, pointer)


def kernels(source: str) -> dict[str, list[Param]]:
    """{name: parameters} of every extern "C" __global__ kernel of a .cu source."""
    out = {}
    for name, params in _KERNEL.findall(source):
        out[name] = [parse_param(p) for p in params.split(",") if p.strip()]
    return out


def unit_source(cu_source: str) -> str:
    """A .cu source as one unit of a batch: its kernels' `extern "C"` dropped (their names are C++
    names in the unit's namespace, so units with kernels of the same name share a library), its
    storage types' include guard reset (each namespace declares its own).  Nothing else changes."""
    return re.sub(r'extern\s+"C"\s+__global__', "__global__", cu_source)


def launcher_source(units: list[tuple[str, Path, dict[str, list[Param]]]]) -> str:
    """One translation unit: compat.h, then each (unit name, .cu path, kernels) in a namespace of
    its own with, for each kernel, an extern "C" launcher sg_launch_<unit>_<kernel> (inside the
    namespace, so that the kernel's own types name its parameters)."""
    lines = ['#include "compat.h"', ""]
    for unit, cu_path, sigs in units:
        lines += ["#undef SYMGRAD_STORAGE_TYPES", f"namespace {unit} {{", f'#include "{cu_path}"', ""]
        for name, params in sigs.items():
            decl = "".join(", " + p.declaration for p in params)
            args = ", ".join(p.name for p in params)
            lines += [
                f'extern "C" void sg_launch_{unit}_{name}(unsigned int sg_gx, unsigned int sg_gy, unsigned int sg_gz,',
                f"    unsigned int sg_bx, unsigned int sg_by, unsigned int sg_bz{decl}) {{",
                "  gridDim = dim3{sg_gx, sg_gy, sg_gz};",
                "  blockDim = dim3{sg_bx, sg_by, sg_bz};",
                "  for (unsigned int sg_z = 0; sg_z < sg_gz; ++sg_z)",
                "    for (unsigned int sg_y = 0; sg_y < sg_gy; ++sg_y)",
                "      for (unsigned int sg_x = 0; sg_x < sg_gx; ++sg_x)",
                "        for (unsigned int sg_tz = 0; sg_tz < sg_bz; ++sg_tz)",
                "          for (unsigned int sg_ty = 0; sg_ty < sg_by; ++sg_ty)",
                "            for (unsigned int sg_tx = 0; sg_tx < sg_bx; ++sg_tx) {",
                "              blockIdx = dim3{sg_x, sg_y, sg_z};",
                "              threadIdx = dim3{sg_tx, sg_ty, sg_tz};",
                f"              {name}({args});",
                "            }",
                "}",
                "",
            ]
        lines += [f"}}  // namespace {unit}", ""]
    return "\n".join(lines)


class HostModule:
    """A compiled .cu: launch(name, grid, block, args) runs a kernel's grid serially."""

    def __init__(self, library: Path, sigs: dict[str, list[Param]], unit: str = "u0"):
        self.library = library
        self.sigs = sigs
        self.unit = unit  # the .cu's namespace in its library (a library holds a batch of them)
        self._dll = ctypes.CDLL(str(library))

    def launch(self, name: str, grid, block, args) -> None:
        if name not in self.sigs:
            raise KeyError(f"no kernel {name!r} in {self.library.name}")
        params = self.sigs[name]
        if len(args) != len(params):
            raise TypeError(f"{name} takes {len(params)} arguments, got {len(args)}")
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        if min(grid + block) < 1:
            raise ValueError(f"{name}: empty launch grid {grid} x {block}")
        values, keep = [], []
        for p, a in zip(params, args):
            if p.pointer:
                if not isinstance(a, np.ndarray):
                    raise TypeError(f"{name}: {p.name} ({p.declaration}) needs an array, got {type(a).__name__}")
                if a.dtype.name not in _ELEMENTS[p.base]:
                    raise TypeError(f"{name}: {p.name} ({p.declaration}) got an array of {a.dtype}")
                if "const" not in p.declaration.split("*")[0] and not a.flags.writeable:
                    raise ValueError(f"{name}: {p.name} is written but the array is read-only")
                keep.append(a)
                values.append(ctypes.c_void_p(a.ctypes.data))
            else:
                want, ctype = _SCALARS[p.base]
                if type(a) is not want:
                    raise TypeError(f"{name}: {p.name} ({p.declaration}) needs numpy.{want.__name__}, "
                                    f"got {type(a).__name__}")
                values.append(ctype(int(a)))
        fn = getattr(self._dll, f"sg_launch_{self.unit}_{name}")
        fn.restype = None
        fn(*(ctypes.c_uint(v) for v in grid + block), *values)


def _hash(*parts: str) -> str:
    h = hashlib.sha256()
    for part in (*parts, COMPAT.read_text(), " ".join(CXXFLAGS), find_cxx() or ""):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _entry_path(source: str, cache: Path) -> Path:
    """Where a source's entry is kept: the library that holds it and its unit's name."""
    return cache / f"k{_hash(source)}.json"


def _compile_batch(sources: list[str], cache: Path) -> None:
    """Compile sources (distinct) into one library, one namespace each, and write each source's
    entry (written last, atomically: an entry always names a complete library)."""
    cxx = find_cxx()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    stem = cache / f"b{_hash(*sources)}"
    units = []
    for i, source in enumerate(sources):
        cu = stem.with_name(f"{stem.name}_u{i}.cu")
        cu.write_text(unit_source(source))
        units.append((f"u{i}", cu, kernels(source)))
    wrapper = stem.with_name(stem.name + "_launch.cpp")
    wrapper.write_text(launcher_source(units))
    lib = stem.with_suffix(".so")
    tmp = stem.with_name(stem.name + f".{os.getpid()}.{threading.get_ident()}.tmp.so")
    proc = subprocess.run([cxx, *CXXFLAGS, f"-I{COMPAT.parent}", str(wrapper), "-o", str(tmp)],
                          capture_output=True, text=True)
    if proc.returncode:
        names = ", ".join(str(cu) for _, cu, _ in units)
        raise RuntimeError(f"host compile of {names} failed:\n{proc.stderr[-6000:]}")
    os.replace(tmp, lib)
    for (unit, _, _), source in zip(units, sources):
        entry = _entry_path(source, cache)
        part = entry.with_name(entry.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        part.write_text(json.dumps({"library": lib.name, "unit": unit}))
        os.replace(part, entry)


def build(source: str, cache: Path) -> HostModule:
    """Compile a .cu source (text) for the CPU, once per cache directory (build_many compiles
    several into one library)."""
    cache.mkdir(parents=True, exist_ok=True)
    entry = _entry_path(source, cache)
    if not entry.exists():
        _compile_batch([source], cache)
    where = json.loads(entry.read_text())
    return HostModule(cache / where["library"], kernels(source), where["unit"])


def build_many(sources: list[str], cache: Path, jobs: int | None = None, batch: int = 12) -> None:
    """Compile several sources, `batch` to a translation unit (the compiler's start and its
    headers paid once per batch: about half the time of one unit per source), the batches in
    parallel (the compiler runs in subprocesses).  A batch that fails is compiled again one source
    at a time, so that the error names its .cu."""
    cache.mkdir(parents=True, exist_ok=True)
    todo = [s for s in dict.fromkeys(sources) if not _entry_path(s, cache).exists()]
    jobs = jobs or max(1, min(4, os.cpu_count() or 1))
    size = max(1, min(batch, -(-len(todo) // jobs)))
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]

    def one(group: list[str]) -> None:
        try:
            _compile_batch(group, cache)
        except RuntimeError:
            if len(group) == 1:
                raise
            for source in group:
                _compile_batch([source], cache)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, batches))


# ----------------------------------------------------------------------------- a CuPy stand-in

class _Function:
    def __init__(self, host: HostModule, name: str):
        self.host, self.name = host, name

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.host.launch(self.name, grid, block, args)


class _RawModule:
    cache: Path | None = None
    compiled: list = []  # (options) of every module compiled, for tests

    def __init__(self, code: str, options=(), **_):
        if self.cache is None:
            raise RuntimeError("fake cupy: no build cache set")
        self.options = tuple(options)
        _RawModule.compiled.append(self.options)
        self.host = build(code, self.cache)

    def get_function(self, name: str) -> _Function:
        if name not in self.host.sigs:
            raise KeyError(f"fake cupy: no kernel {name!r}")
        return _Function(self.host, name)


def fake_cupy(cache: Path) -> types.ModuleType:
    """A module named cupy whose arrays are NumPy arrays and whose kernels run on the CPU."""
    m = types.ModuleType("cupy")
    m.__doc__ = "CPU stand-in for CuPy (symgrad tests): NumPy arrays, kernels via the host harness"
    m.ndarray = np.ndarray
    for name in ("asarray", "empty", "zeros", "ascontiguousarray", "moveaxis", "broadcast_to",
                 "result_type", "dtype", "float16", "float32", "float64", "int32", "int64", "uint8",
                 "arange", "argsort", "searchsorted"):
        setattr(m, name, getattr(np, name))
    raw = type("RawModule", (_RawModule,), {"cache": cache})
    m.RawModule = raw
    m.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0))
    m.FAKE = True
    return m
