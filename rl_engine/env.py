"""The only module that reads environment variables.

Every variable that can change what the package does is listed in ``BEHAVIOUR_VARIABLES`` and
recorded in the provenance of every evidence artifact. Values are read at call time, never at
import time.

Variables
---------
TRITON_INTERPRET
    ``1`` runs Triton kernels in Triton's CPU interpreter (tests and the ``smoke`` gate on a
    machine without a GPU). Kernels then upcast BF16 ``tl.dot`` operands to FP32 with IEEE input
    precision, because the interpreter does not support BF16 dots (triton-lang/triton#11584).
OPENBLAS_*, MKL_*, OMP_*, NPY_*, ATEN_CPU_CAPABILITY, ...
    Never read to switch behaviour; recorded in provenance because they choose the host's BLAS
    kernel, SIMD target or thread count (see :data:`HOST_ARITHMETIC_PREFIXES`).
RL_ENGINE_CACHE_DIR
    Where compiled CUDA extensions are cached (default ``~/.cache/rl_engine``).
RL_ENGINE_SOURCE_COMMIT, RL_ENGINE_SOURCE_DIRTY
    Provenance only: the source commit (and ``1``/``0`` dirty flag) of a copied tree that has no
    git history of its own (e.g. a remote GPU machine). Used only when git cannot tell, and
    recorded as coming from the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

BEHAVIOUR_VARIABLES = (
    "TRITON_INTERPRET",
    "RL_ENGINE_CACHE_DIR",
    "CUDA_VISIBLE_DEVICES",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "OMP_NUM_THREADS",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
)


HOST_ARITHMETIC_PREFIXES = ("OPENBLAS_", "GOTO", "MKL_", "OMP_", "NPY_", "ATEN_CPU_CAPABILITY", "KMP_")
"""Variables that pick a host library's kernels or threads (BLAS core type, SIMD targets).
Recorded in provenance (``host_arithmetic.variables``); the package never reads them itself."""


def host_arithmetic_variables() -> dict[str, str]:
    """Every set variable whose name starts with one of :data:`HOST_ARITHMETIC_PREFIXES`."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(HOST_ARITHMETIC_PREFIXES)}


def triton_interpret() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0", "false", "False")


def rich_disabled() -> bool:
    """True when ``NO_COLOR`` or ``CI`` is set (plain progress lines instead of a live bar)."""
    return bool(os.environ.get("NO_COLOR") or os.environ.get("CI"))


def cache_dir() -> Path:
    """Folder for build caches (``RL_ENGINE_CACHE_DIR`` or ``~/.cache/rl_engine``)."""
    value = os.environ.get("RL_ENGINE_CACHE_DIR")
    return Path(value) if value else Path.home() / ".cache" / "rl_engine"


def source_commit_override() -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` from RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY (None when unset)."""
    commit = os.environ.get("RL_ENGINE_SOURCE_COMMIT") or None
    dirty = os.environ.get("RL_ENGINE_SOURCE_DIRTY")
    return commit, (None if dirty is None else dirty.strip() not in ("0", "", "false", "False"))


def behaviour_snapshot() -> dict[str, str | None]:
    """The current value of every behaviour-changing variable (``None`` when unset)."""
    return {name: os.environ.get(name) for name in BEHAVIOUR_VARIABLES}


def enable_triton_interpreter() -> None:
    """Ask Triton to interpret kernels on the CPU. Must run before any kernel module is imported
    (``triton.jit`` decides between compiled and interpreted functions when a module is imported).
    The CLI calls this when no CUDA GPU is present; library code never does."""
    os.environ["TRITON_INTERPRET"] = "1"


def get_variables(names) -> dict[str, str | None]:
    """Current values of ``names`` (None when unset)."""
    return {name: os.environ.get(name) for name in names}


def set_variables(values: dict[str, str]) -> dict[str, str | None]:
    """Set environment variables (inherited by processes started afterwards); returns the old values."""
    before = get_variables(values)
    os.environ.update(values)
    return before


def restore_variables(before: dict[str, str | None]) -> None:
    """Undo :func:`set_variables`."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def torchrun_rank() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when started by torchrun, else None.

    Raises ValueError when the variables are present but not integers."""
    if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
