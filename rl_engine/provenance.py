"""Provenance: what ran, where, with which software (WS1 §10), and which kernel source it was.

:func:`kernel_id` names the exact source of an implementation (``op/backend/function@hash``); the
gate, the chain and the TP runs record it with every result.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import inspect
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_engine import env
from rl_engine.constants import __version__


def kernel_id(op: str, backend: str, impl: Callable[..., Any]) -> str:
    """``op/backend/function@source-hash``: identifies the exact kernel source that ran (the hash is
    the first 12 hex digits of the SHA-256 of the file defining ``impl``, after unwrapping)."""
    try:
        impl = inspect.unwrap(impl)
        src = inspect.getsourcefile(impl)
        digest = hashlib.sha256(Path(src).read_bytes()).hexdigest()[:12] if src else "unknown"
    except (TypeError, OSError):
        digest = "unknown"
    return f"{op}/{backend}/{getattr(impl, '__name__', 'impl')}@{digest}"


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.rstrip() if out.returncode == 0 else None  # keep leading blanks: porcelain columns


def git_state(start: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the checkout that holds the package (or ``start``)."""
    here = start or Path(__file__).resolve().parent
    commit = _git(["rev-parse", "HEAD"], here)
    commit = commit.strip() if commit else None
    status = _git(["status", "--porcelain", "--untracked-files=normal"], here)
    tracked = _git(["status", "--porcelain", "--untracked-files=no"], here)
    state = {
        "git_commit": commit,
        "git_dirty_tracked": None if tracked is None else sorted(line[3:] for line in tracked.splitlines()),
        "git_dirty": None if status is None else bool(status),
        "git_dirty_files": [] if not status else [line[3:] for line in status.splitlines()][:50],
        "git_commit_source": "git",
    }
    env_commit, env_dirty = env.source_commit_override()
    if env_commit is not None:
        # Set by whoever copied the tree (e.g. to a lent GPU machine): it wins over what a git
        # directory found there says, which may be an older checkout under the copied files. What
        # git saw is kept beside it (its file list belongs to git's view, not to the declared commit).
        state.update(git_commit=env_commit, git_dirty=env_dirty, git_commit_source="environment (RL_ENGINE_SOURCE_COMMIT)",
                     git_seen={"commit": commit, "dirty_tracked": state["git_dirty_tracked"],
                               "dirty_files": state["git_dirty_files"]},
                     git_dirty_files=[])
        state.pop("git_dirty_tracked")
    return state


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info() -> dict[str, Any]:
    """GPU name, compute capability, SM count, memory, driver; or the CPU model."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        driver = None
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            driver = None
        return {
            "kind": "cuda",
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "total_memory_gib": round(props.total_memory / 2**30, 2),
            "driver": driver,
            "device_count": torch.cuda.device_count(),
        }
    return {"kind": "cpu", "name": _cpu_model(), "compute_capability": None, "sm_count": None,
            "cores": __import__("os").cpu_count(), "driver": None}


def software() -> dict[str, Any]:
    import numpy
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # pragma: no cover - depends on the install
        triton_version = None
    return {
        "rl_engine": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "host_arithmetic": host_arithmetic(),
    }


def host_arithmetic() -> dict[str, Any]:
    """What on this host could change CPU-side bits: the BLAS libraries loaded in this process
    (name, version, the kernel family in use, e.g. OpenBLAS ``Haswell``, threads), NumPy's SIMD
    targets and PyTorch's CPU capability. Kernel bits under the Triton interpreter do not depend
    on these (``rl_engine.ops._interpreter``); the FP32 references and input draws run through
    PyTorch on the CPU, so the record lets ``rl-engine diff`` explain a difference between hosts."""
    import numpy
    import torch

    blas: list[dict[str, Any]] = []
    try:
        import threadpoolctl

        for lib in threadpoolctl.threadpool_info():
            blas.append({"api": lib.get("user_api"), "name": lib.get("internal_api"), "version": lib.get("version"),
                         "core_type": lib.get("architecture"), "threads": lib.get("num_threads"),
                         "threading_layer": lib.get("threading_layer"),
                         "library": Path(lib.get("filepath", "")).name})
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        blas.append({"error": "threadpoolctl is not installed"})
    try:
        from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__
    except ImportError:  # pragma: no cover - NumPy < 2
        from numpy.core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__
    simd = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    return {
        "blas": blas,
        "numpy_simd_baseline": list(__cpu_baseline__),
        "numpy_simd_dispatch_in_use": simd,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_num_threads": torch.get_num_threads(),
        "variables": env.host_arithmetic_variables(),
    }


def collect(contract: Any | None = None) -> dict[str, Any]:
    """Everything evidence needs to say where and how it was produced."""
    from rl_engine.ops.reference_guard import precision_readback

    prov: dict[str, Any] = {
        **git_state(),
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "device": device_info(),
        "software": software(),
        "precision_readback_outside_guard": precision_readback(),
        "environment": env.behaviour_snapshot(),
        "triton_interpret": env.triton_interpret(),
    }
    if contract is not None:
        prov["contract"] = contract.identity()
    return prov
