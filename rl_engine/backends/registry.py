"""Which backends exist, whether each can run here (and why not), and how to get an op's impl.

Selection is explicit: asking for a backend that cannot run raises
:class:`~rl_engine.errors.BackendUnavailable` with the reason; nothing falls back silently.
Out-of-scope targets (FP8, ROCm, Ascend) raise :class:`~rl_engine.errors.ContractError`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from rl_engine import env
from rl_engine.errors import BackendUnavailable, RLEngineError

BACKENDS = ("reference_fp32", "torch_bf16", "triton_cuda_bf16", "cuda_bf16")
KERNEL_BACKENDS = ("triton_cuda_bf16", "cuda_bf16")
"""Backends the gate judges (the other two are the reference and the relative-criterion baseline)."""


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def availability(backend: str) -> tuple[bool, str]:
    """``(can_run, reason)`` for a backend on this machine."""
    if backend in ("reference_fp32", "torch_bf16"):
        return True, "PyTorch runs everywhere"
    if backend == "triton_cuda_bf16":
        try:
            import triton  # noqa: F401
        except Exception as exc:  # pragma: no cover - depends on the install
            return False, f"triton is not importable: {exc}"
        if _cuda_available():
            return True, "CUDA GPU present"
        if env.triton_interpret():
            return True, "Triton CPU interpreter (TRITON_INTERPRET=1)"
        return False, ("no CUDA GPU and TRITON_INTERPRET is not set (the gate, bench --dry-run and the tests "
                       "turn the CPU interpreter on by themselves when no GPU is present)")
    if backend == "cuda_bf16":
        if not _cuda_available():
            return False, "no CUDA GPU on this machine (the CUDA sources are compile-checked by the tests)"
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        if (major, minor) != (9, 0):
            return False, f"cuda_bf16 is built for sm_90a (Hopper); this GPU is compute capability {major}.{minor}"
        if shutil.which("nvcc") is None:
            return False, "nvcc is not on PATH"
        return True, "CUDA GPU and nvcc present"
    return False, f"unknown backend {backend!r}"


def check_backend(backend: str) -> None:
    """Raise unless ``backend`` is known and can run here (built-in, registered, or an adapter)."""
    if backend not in BACKENDS:
        from rl_engine.backends.plugins import get_plugin

        plugin = get_plugin(backend)  # an adapter whose library is missing raises BackendUnavailable
        if plugin is not None:
            ok, why = plugin.availability()
            if not ok:
                raise BackendUnavailable(f"backend {backend} cannot run here: {why}")
            return
        from rl_engine.contract import load_contract

        contract = load_contract()
        out_of_scope = contract.data["backend_profiles"]["out_of_scope"]
        if any(key in backend.lower() for key in out_of_scope):
            contract.check_backend_profile(backend)  # raises ContractError naming why it is out of scope
        from rl_engine.backends.plugins import plugin_names

        raise RLEngineError(f"unknown backend {backend!r}; valid: {', '.join(list(BACKENDS) + plugin_names())}")
    ok, why = availability(backend)
    if not ok:
        raise BackendUnavailable(f"backend {backend} cannot run here: {why}")


def available_backends(kernel_only: bool = True) -> list[str]:
    names = KERNEL_BACKENDS if kernel_only else BACKENDS
    return [b for b in names if availability(b)[0]]


def resolve_impl(op: str, backend: str) -> Callable[..., Any]:
    """The implementation of ``op`` on ``backend``, after checking the backend can run."""
    from rl_engine.ops.registry import get_spec

    check_backend(backend)
    if backend not in BACKENDS:
        from rl_engine.backends.plugins import get_plugin

        plugin = get_plugin(backend)
        if op not in plugin.ops:
            raise BackendUnavailable(f"backend {backend} does not provide {op}")
        return plugin.ops[op]
    spec = get_spec(op)
    if backend not in spec.impls:
        raise BackendUnavailable(f"op {op} has no {backend} implementation")
    return spec.impls[backend]
