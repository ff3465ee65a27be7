"""Build, cache and load the ``cuda_bf16`` backend: one shared library from the ``.cu`` sources.

The CUDA C++ kernels live in ``rl_engine/backends/cuda_src/`` (framework-free: no torch headers;
``extern "C"`` host launchers that take raw device pointers, sizes, strides and a ``cudaStream_t``
and return the ``cudaError_t`` of the launch). This module

* compiles every ``.cu`` file to an object with ``nvcc`` in parallel (one process per file) and
  links them with ``nvcc -shared`` into ``librl_cuda.so`` for ``sm_90a`` (H100 / H200);
* caches the library under ``rl_engine.env.cache_dir() / "cuda" / <key> / "librl_cuda.so"``, where
  ``<key>`` is the SHA-256 of every source (names and bytes), the flags and ``nvcc --version``;
* is safe against processes building at once: an ``fcntl`` lock per key, the build in a private
  temporary folder, and an atomic ``os.replace`` of the finished library into place;
* loads the library with ``ctypes`` and sets each export's argument types from its prototype in
  the sources, so the Python side cannot drift from the C signatures;
* offers :func:`compile_check`, which compiles every ``.cu`` file to an object without a GPU (what
  CI runs on machines that have ``nvcc`` but no GPU).

Flags: ``-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -fmad=false``, IEEE division and
square root, no flush-to-zero, never ``--use_fast_math``. ``-fmad=false`` stops the compiler from
fusing ``a * b + c`` on its own: every FMA in the kernels is written out (``__fmaf_rn``), so one
source expression rounds the same way in every kernel that uses it.

Nothing happens at import: no build, no environment read, no library load.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_engine import env
from rl_engine.errors import BackendUnavailable, RLEngineError

SOURCE_DIR = Path(__file__).resolve().parent / "cuda_src"
"""The CUDA sources of the backend."""

LIBRARY_NAME = "librl_cuda.so"

ARCH_FLAGS: tuple[str, ...] = ("-gencode=arch=compute_90a,code=sm_90a",)
"""Hopper with its architecture-specific features (H100 / H200, compute capability 9.0)."""

NVCC_FLAGS: tuple[str, ...] = (
    "-O3",
    "-std=c++17",
    *ARCH_FLAGS,
    "-fmad=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-ftz=false",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
    "-lineinfo",
)
"""Flags of every object compile (no --use_fast_math: IEEE math throughout)."""

LINK_FLAGS: tuple[str, ...] = ("-shared", *ARCH_FLAGS, "-cudart=static")

ABI_VERSION = 2
"""Must equal ``RL_ABI_VERSION`` in ``cuda_src/runtime.cu``."""


class CudaBuildError(RLEngineError):
    """``nvcc`` failed; the message holds the command and its output."""


class CudaKernelError(RLEngineError):
    """A CUDA launch returned an error; the message names the launcher and the CUDA error string."""


@dataclass
class BuildResult:
    """Where the library is and how it got there."""

    path: Path
    key: str
    cached: bool
    seconds: float
    """Wall time of this call (lock wait + compile + link, or the cache lookup)."""
    compile_seconds: dict[str, float] = field(default_factory=dict)
    """Per source file, from the build that produced the library (also when loaded from cache)."""
    link_seconds: float = 0.0
    build_seconds: float = 0.0
    """Wall time of the build that produced the library (parallel compile + link)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "key": self.key,
            "cached": self.cached,
            "seconds": self.seconds,
            "compile_seconds": dict(self.compile_seconds),
            "link_seconds": self.link_seconds,
            "build_seconds": self.build_seconds,
        }


# ------------------------------------------------------------------------------------------------
# nvcc and sources


def nvcc_path() -> str:
    """Absolute path of ``nvcc`` on PATH; raises BackendUnavailable when there is none."""
    path = shutil.which("nvcc")
    if path is None:
        raise BackendUnavailable("cuda_bf16: nvcc is not on PATH, so the CUDA sources cannot be built")
    return path


_NVCC_VERSION: dict[str, str] = {}


def nvcc_version(nvcc: str | None = None) -> str:
    """The full ``nvcc --version`` text (part of the cache key)."""
    nvcc = nvcc or nvcc_path()
    if nvcc not in _NVCC_VERSION:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CudaBuildError(f"`{nvcc} --version` failed: {proc.stderr.strip()}")
        _NVCC_VERSION[nvcc] = proc.stdout.strip()
    return _NVCC_VERSION[nvcc]


def source_files(src_dir: Path = SOURCE_DIR) -> list[Path]:
    """Every ``.cu`` / ``.cuh`` / ``.h`` file of the backend, sorted by name."""
    return sorted(p for p in Path(src_dir).iterdir() if p.suffix in (".cu", ".cuh", ".h") and p.is_file())


def cu_files(src_dir: Path = SOURCE_DIR) -> list[Path]:
    """The translation units (``.cu``), sorted by name."""
    return [p for p in source_files(src_dir) if p.suffix == ".cu"]


def cache_key(src_dir: Path = SOURCE_DIR, flags: Sequence[str] = NVCC_FLAGS,
              link_flags: Sequence[str] = LINK_FLAGS, nvcc: str | None = None) -> str:
    """SHA-256 of the sources (names and bytes), the compile and link flags and ``nvcc --version``."""
    h = hashlib.sha256()
    h.update(b"rl_engine cuda_bf16 v1\0")
    for p in source_files(src_dir):
        h.update(p.name.encode() + b"\0")
        data = p.read_bytes()
        h.update(str(len(data)).encode() + b"\0")
        h.update(data)
    h.update("\0".join(flags).encode() + b"\0\0")
    h.update("\0".join(link_flags).encode() + b"\0\0")
    h.update(nvcc_version(nvcc).encode())
    return h.hexdigest()


def _run(cmd: list[str], cwd: Path | None = None) -> tuple[bool, float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    dt = time.perf_counter() - t0
    log = " ".join(cmd) + "\n" + proc.stdout + proc.stderr
    return proc.returncode == 0, dt, log


def _compile_one(nvcc: str, src: Path, obj: Path, flags: Sequence[str], extra: Sequence[str] = ()) -> tuple[bool, float, str]:
    return _run([nvcc, *flags, *extra, "-I", str(src.parent), "-c", str(src), "-o", str(obj)])


def _compile_all(nvcc: str, sources: list[Path], out_dir: Path, flags: Sequence[str],
                 extra: Sequence[str] = (), jobs: int | None = None) -> list[tuple[str, bool, float, str, Path]]:
    jobs = jobs or max(1, min(len(sources), os.cpu_count() or 1))
    out: list[tuple[str, bool, float, str, Path]] = []

    def work(src: Path) -> tuple[str, bool, float, str, Path]:
        obj = out_dir / (src.stem + ".o")
        ok, dt, log = _compile_one(nvcc, src, obj, flags, extra)
        return src.name, ok, dt, log, obj

    # Longest translation units first keeps the two CI cores busy until the end.
    order = sorted(sources, key=lambda p: -p.stat().st_size)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(work, order))
    by_name = {r[0]: r for r in results}
    for src in sources:
        out.append(by_name[src.name])
    return out


# ------------------------------------------------------------------------------------------------
# build with cache and lock


def build(*, src_dir: Path = SOURCE_DIR, flags: Sequence[str] = NVCC_FLAGS, link_flags: Sequence[str] = LINK_FLAGS,
          cache_root: Path | None = None, force: bool = False, jobs: int | None = None) -> BuildResult:
    """Build (or find in the cache) the shared library of ``src_dir``; return where it is.

    Two processes may call this at once: the first takes the key's lock and builds, the second
    waits on the lock and then finds the finished library. A failed build leaves nothing in the
    cache and raises :class:`CudaBuildError` with nvcc's output.
    """
    t0 = time.perf_counter()
    nvcc = nvcc_path()
    key = cache_key(src_dir, flags, link_flags, nvcc)
    root = Path(cache_root) if cache_root is not None else env.cache_dir() / "cuda"
    root.mkdir(parents=True, exist_ok=True)
    final_dir = root / key
    lib = final_dir / LIBRARY_NAME
    meta_path = final_dir / "build.json"
    lock_path = root / f"{key}.lock"
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if lib.is_file() and not force:
                meta = _read_meta(meta_path)
                return BuildResult(lib, key, True, time.perf_counter() - t0, meta.get("compile_seconds", {}),
                                   meta.get("link_seconds", 0.0), meta.get("build_seconds", 0.0))
            tmp = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=root))
            try:
                b0 = time.perf_counter()
                results = _compile_all(nvcc, cu_files(src_dir), tmp, flags, jobs=jobs)
                failed = [r for r in results if not r[1]]
                if failed:
                    logs = "\n\n".join(f"--- {name} ---\n{log}" for name, _, _, log, _ in failed)
                    raise CudaBuildError(f"nvcc failed on {', '.join(r[0] for r in failed)}:\n{logs}")
                tmp_lib = tmp / LIBRARY_NAME
                ok, link_dt, log = _run([nvcc, *link_flags, "-o", str(tmp_lib), *[str(r[4]) for r in results]])
                if not ok:
                    raise CudaBuildError(f"linking {LIBRARY_NAME} failed:\n{log}")
                build_dt = time.perf_counter() - b0
                compile_seconds = {name: dt for name, _, dt, _, _ in results}
                final_dir.mkdir(parents=True, exist_ok=True)
                meta = {"key": key, "compile_seconds": compile_seconds, "link_seconds": link_dt,
                        "build_seconds": build_dt, "flags": list(flags), "link_flags": list(link_flags),
                        "nvcc_version": nvcc_version(nvcc), "built_at": time.time()}
                tmp_meta = tmp / "build.json"
                tmp_meta.write_text(json.dumps(meta, indent=1))
                os.replace(tmp_meta, meta_path)
                os.replace(tmp_lib, lib)  # atomic: a reader sees the old file or the whole new one
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return BuildResult(lib, key, False, time.perf_counter() - t0, compile_seconds, link_dt, build_dt)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def compile_check(out_dir: str | os.PathLike[str], *, src_dir: Path = SOURCE_DIR, flags: Sequence[str] = NVCC_FLAGS,
                  verbose_ptxas: bool = True, jobs: int | None = None) -> list[tuple[str, bool, float, str]]:
    """Compile every ``.cu`` file to an object in ``out_dir`` (no GPU needed).

    Returns ``[(file name, ok, seconds, log)]`` in file-name order; with ``verbose_ptxas`` the log
    holds ptxas' register / spill / shared-memory report of every kernel. Raises
    BackendUnavailable when ``nvcc`` is not on PATH.
    """
    nvcc = nvcc_path()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = ("-Xptxas=-v",) if verbose_ptxas else ()
    return [(name, ok, dt, log) for name, ok, dt, log, _ in _compile_all(nvcc, cu_files(src_dir), out, flags, extra, jobs)]


# ------------------------------------------------------------------------------------------------
# loading and calling

_PROTO = re.compile(r"^RL_EXPORT\s+(int64_t|int|const char\*)\s+(rl_\w+)\((.*)\)\s*\{", re.MULTILINE)

_CTYPE = {
    "const void*": ctypes.c_void_p,
    "void*": ctypes.c_void_p,
    "int64_t": ctypes.c_int64,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}

_RESTYPE = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "const char*": ctypes.c_char_p}


def parse_prototypes(src_dir: Path = SOURCE_DIR) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """``{name: (return type, [(arg type, arg name), ...])}`` of every ``RL_EXPORT`` in the sources."""
    protos: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for src in cu_files(src_dir):
        for m in _PROTO.finditer(src.read_text()):
            ret, name, args = m.group(1), m.group(2), m.group(3).strip()
            parsed: list[tuple[str, str]] = []
            if args and args != "void":
                for arg in args.split(","):
                    arg = arg.strip()
                    am = re.match(r"^(const void\*|void\*|int64_t|int|float|double)\s*(\w+)$", arg)
                    if am is None:
                        raise CudaBuildError(f"{src.name}: cannot parse argument {arg!r} of {name}")
                    parsed.append((am.group(1), am.group(2)))
            if name in protos:
                raise CudaBuildError(f"{src.name}: {name} is exported twice")
            protos[name] = (ret, parsed)
    return protos


def source_abi_version(src_dir: Path = SOURCE_DIR) -> int:
    """``RL_ABI_VERSION`` as ``src_dir/runtime.cu`` defines it (a frozen copy of older sources, which
    tests load with their own prototypes, carries its own version)."""
    m = re.search(r"#define RL_ABI_VERSION (\d+)", (Path(src_dir) / "runtime.cu").read_text())
    if m is None:
        raise CudaBuildError(f"{src_dir}/runtime.cu defines no RL_ABI_VERSION")
    return int(m.group(1))


class CudaLibrary:
    """The loaded ``librl_cuda.so`` with typed entry points."""

    def __init__(self, result: BuildResult, src_dir: Path = SOURCE_DIR) -> None:
        self.build = result
        self._lib = ctypes.CDLL(str(result.path))
        self._protos = parse_prototypes(src_dir)
        for name, (ret, args) in self._protos.items():
            fn = getattr(self._lib, name)
            fn.restype = _RESTYPE[ret]
            fn.argtypes = [_CTYPE[t] for t, _ in args]
        abi = int(self._lib.rl_abi_version())
        expected = ABI_VERSION if Path(src_dir) == SOURCE_DIR else source_abi_version(src_dir)
        if abi != expected:
            raise CudaBuildError(f"{result.path} has ABI version {abi}, the Python side expects {expected}")

    def error_string(self, code: int) -> str:
        raw = self._lib.rl_cuda_error_string(int(code))
        return raw.decode() if raw else f"CUDA error {code}"

    def query(self, name: str, *args: int) -> int:
        """Call an ``int64_t`` export with integer arguments (a kernel constant such as a block
        size, or a scratch size the host must allocate)."""
        ret, spec = self._protos.get(name, ("", []))
        if ret != "int64_t" or len(spec) != len(args):
            raise RLEngineError(f"{LIBRARY_NAME}: {name} is not an int64_t query taking {len(args)} arguments")
        return int(getattr(self._lib, name)(*[int(a) for a in args]))

    def call(self, name: str, *args: Any) -> None:
        """Call launcher ``name``; tensors become their ``data_ptr()``, ``None`` a null pointer.

        Raises CudaKernelError with the CUDA error string when the launcher returns non-zero.
        """
        if name not in self._protos:
            raise RLEngineError(f"{LIBRARY_NAME} has no export {name}")
        ret, spec = self._protos[name]
        if len(args) != len(spec):
            raise RLEngineError(f"{name} takes {len(spec)} arguments ({', '.join(n for _, n in spec)}), got {len(args)}")
        conv = []
        for (typ, arg_name), value in zip(spec, args):
            if typ in ("const void*", "void*"):
                if value is None:
                    conv.append(None)
                elif isinstance(value, int):
                    conv.append(value)
                elif hasattr(value, "data_ptr"):
                    conv.append(value.data_ptr())
                else:
                    raise RLEngineError(f"{name}: argument {arg_name} must be a tensor, a pointer or None")
            elif typ in ("float", "double"):
                conv.append(float(value))
            else:
                conv.append(int(value))
        code = getattr(self._lib, name)(*conv)
        if ret == "int" and code != 0:
            raise CudaKernelError(f"{name} failed: CUDA error {code} ({self.error_string(code)})")


_LIB: CudaLibrary | None = None
_LIB_LOCK = threading.Lock()


def load_library() -> CudaLibrary:
    """Build (or find in the cache) and load the library once per process."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            _LIB = CudaLibrary(build())
        return _LIB
