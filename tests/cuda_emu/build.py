"""Build the host emulation of the cuda_bf16 library (tests only; see emu.h).

The CUDA sources are copied with three mechanical rewrites (no kernel code changes):
``#include <mma.h>`` is dropped (emu.h provides the WMMA API), the dynamic shared-memory
declaration becomes ``unsigned char* smem_raw = emu_dynamic_smem();``, and each
``kernel<<<cfg>>>(args)`` becomes ``emu_launch(kernel, emu_cfg(cfg), args)``. The result is
compiled with g++ (C++20, ``-ffp-contract=off`` like ``-fmad=false``) into one shared library
with the same ``rl_*`` exports as the real one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rl_engine.backends import cuda_build

HERE = Path(__file__).resolve().parent
LAUNCH = re.compile(r"\b([A-Za-z_]\w*(?:<[^<>;{}]*>)?)\s*<<<(.*?)>>>\s*\(", re.DOTALL)
DYN_SMEM = re.compile(r"extern\s+__shared__\s+__align__\(\d+\)\s+unsigned char\s+(\w+)\[\];")


def cuda_include_dir() -> Path:
    nvcc = Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc").resolve()
    for cand in (nvcc.parent.parent / "include", Path("/usr/local/cuda/include")):
        if (cand / "cuda_runtime.h").is_file():
            return cand
    raise FileNotFoundError("cuda_runtime.h not found (the emulator needs the CUDA headers)")


def rewrite(text: str) -> str:
    text = text.replace("#include <mma.h>", "")
    text = DYN_SMEM.sub(r"unsigned char* \1 = emu_dynamic_smem();", text)
    return LAUNCH.sub(r"emu_launch(\1, emu_cfg(\2), ", text)


def build(out_root: Path, src_dir: Path | None = None) -> Path:
    """Compile the emulated library under ``out_root`` (cached by a hash of its inputs).

    ``src_dir`` replaces the package's ``cuda_src`` (tests build a frozen copy of earlier kernels
    to compare against); the default is the package's own sources.
    """
    gxx = shutil.which("g++")
    if gxx is None:
        raise FileNotFoundError("g++ is not on PATH")
    inc = cuda_include_dir()
    sources = cuda_build.source_files() if src_dir is None else cuda_build.source_files(Path(src_dir))
    h = hashlib.sha256()
    for p in [*sources, HERE / "emu.h", HERE / "emu.cpp", Path(__file__)]:
        h.update(p.name.encode() + p.read_bytes())
    key = h.hexdigest()[:20]
    lib = out_root / f"librl_cuda_emu-{key}.so"
    if lib.is_file():
        return lib
    out_root.mkdir(parents=True, exist_ok=True)
    # Test processes start at once (pytest-xdist): the first one builds, the others wait on the
    # key's lock and find the library, instead of each compiling the same sources.
    with open(out_root / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if not lib.is_file():
                _build_into(lib, sources, gxx, inc)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return lib


def _build_into(lib: Path, sources: list[Path], gxx: str, inc: Path) -> None:
    out_root = lib.parent
    tmp = Path(tempfile.mkdtemp(prefix="emu-", dir=out_root))
    try:
        for p in sources:
            (tmp / p.name).write_text(rewrite(p.read_text()))
        shutil.copy(HERE / "emu.h", tmp / "emu.h")
        shutil.copy(HERE / "emu.cpp", tmp / "emu.cpp")
        flags = ["-std=c++20", "-O1", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-w", "-pthread",
                 "-I", str(tmp), "-I", str(inc)]
        units = [tmp / p.name for p in sources if p.suffix == ".cu"] + [tmp / "emu.cpp"]

        def compile_one(src: Path) -> Path:
            obj = src.with_suffix(".o")
            pre = [] if src.name == "emu.cpp" else ["-include", str(tmp / "emu.h")]
            cmd = [gxx, *flags, *pre, "-x", "c++", "-c", str(src), "-o", str(obj)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"emulator compile failed for {src.name}:\n{proc.stderr[-6000:]}")
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objs = list(pool.map(compile_one, units))
        tmp_lib = tmp / lib.name
        proc = subprocess.run([gxx, "-shared", "-pthread", "-o", str(tmp_lib), *map(str, objs)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"emulator link failed:\n{proc.stderr[-6000:]}")
        os.replace(tmp_lib, lib)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
