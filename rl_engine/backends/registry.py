"""The one backend registry: which backends exist, whether each can run here (and why not), and
the implementation of an op on one of them.

Built-in backends (``reference_fp32``, ``torch_bf16``, ``triton_cuda_bf16``, ``cuda_bf16``) and
external ones (registered from Python with :func:`register_backend`, shipped by a package through
the entry-point group ``rl_engine.backends``, or one of the adapters in
:mod:`rl_engine.backends.adapters`) are the same frozen type, :class:`Backend`. Each answers
:meth:`Backend.available` with ``(can_run, reason)``; the answer is worked out once per process
(the probe imports Triton, asks CUDA for the device and looks for ``nvcc``) and then cached, so an
op call never pays for it.

Selection is explicit: asking for a backend that cannot run raises
:class:`~rl_engine.errors.BackendUnavailable` with the reason, an unknown name raises
:class:`~rl_engine.errors.RLEngineError` with the list of valid names; nothing falls back
silently. Given the contract, names of targets it declares out of scope (FP8, ROCm, Ascend) raise
:class:`~rl_engine.errors.ContractError` instead (``docs/decisions.md``, "Backends").

An external backend implements any subset of the 13 ops with the signatures of
``docs/ops-api.md``::

    import rl_engine
    rl_engine.register_backend("my_kernels", {"rms_norm": my_rms_norm}, backward={"rms_norm"},
                               batch_invariant=True)

The gate then judges it: ops it does not provide show as ``not provided``, so does a backward it
does not provide; invariance is judged only where it claims batch invariance (a claim it makes
and fails is red). An entry point loads to a :class:`Backend` (or a zero-argument callable
returning one, e.g. :func:`plugin_backend`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rl_engine import env
from rl_engine.backends.backend import BUILTIN_NAMES, DECODE_OP, Backend, plugin_backend
from rl_engine.errors import BackendUnavailable, ContractError, RLEngineError

if TYPE_CHECKING:  # only for annotations
    from rl_engine.contract import Contract

BACKENDS = BUILTIN_NAMES
KERNEL_BACKENDS = ("triton_cuda_bf16", "cuda_bf16")
"""Backends the gate judges (the other two are the reference and the relative-criterion baseline)."""

ENTRY_POINT_GROUP = "rl_engine.backends"

__all__ = ["BACKENDS", "DECODE_OP", "KERNEL_BACKENDS", "Backend", "availability", "available_backends",
           "backend_names", "check_backend", "external_backend", "get_backend", "plugin_backend",
           "register_backend", "resolve_impl", "unregister_backend"]


# -- the built-in backends ----------------------------------------------------------------------
def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _probe_triton() -> tuple[bool, str]:
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


def _probe_cuda() -> tuple[bool, str]:
    if not _cuda_available():
        return False, "no CUDA GPU on this machine (the CUDA sources are compile-checked by the tests)"
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) != (9, 0):
        return False, f"cuda_bf16 is built for sm_90a (Hopper); this GPU is compute capability {major}.{minor}"
    if shutil.which("nvcc") is None:
        return False, "nvcc is not on PATH"
    return True, "CUDA GPU and nvcc present"


def _builtins() -> dict[str, Backend]:
    return {
        "reference_fp32": Backend("reference_fp32", description="FP32 gold: PyTorch under the reference guard"),
        "torch_bf16": Backend("torch_bf16", description="plain PyTorch BF16, as Hugging Face code computes"),
        "triton_cuda_bf16": Backend("triton_cuda_bf16", _probe_triton, kernel=True, description="Triton kernels"),
        "cuda_bf16": Backend("cuda_bf16", _probe_cuda, kernel=True, description="CUDA C++ kernels (sm_90a)"),
    }


_BUILTIN: dict[str, Backend] = _builtins()
_EXTERNAL: dict[str, Backend] = {}
_ENTRY_POINTS_LOADED = False


# -- external backends --------------------------------------------------------------------------
def register_backend(name: str, ops: Mapping[str, Callable[..., Any]], *, backward: bool | Iterable[str] = (),
                     batch_invariant: bool | Iterable[str] = (), description: str = "",
                     available: Callable[[], tuple[bool, str]] | None = None) -> Backend:
    """Register an external backend for the gate (in this process); see :func:`plugin_backend`.

    ``ops`` maps op names (any subset of ``rl_engine.OPS``) to callables with the op's API. A
    second registration under the same name replaces the first.
    """
    backend = plugin_backend(name, ops, backward=backward, batch_invariant=batch_invariant,
                             description=description, available=available)
    _EXTERNAL[name] = backend
    return backend


def unregister_backend(name: str) -> None:
    _EXTERNAL.pop(name, None)


def _failed(name: str, origin: str, why: str) -> Backend:
    """A stand-in for an external backend that could not be loaded: it exists and cannot run."""
    return Backend(name, lambda: (False, why), ops={}, kernel=True, origin=origin, description="failed to load")


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _EXTERNAL or ep.name in BACKENDS:
            continue
        try:
            obj = ep.load()
            backend = obj() if callable(obj) and not isinstance(obj, Backend) else obj
        except Exception as exc:  # a broken third-party plugin must not break the tool
            _EXTERNAL[ep.name] = _failed(ep.name, "entry_point", f"entry point failed to load: {exc}")
            continue
        if isinstance(backend, Backend):
            _EXTERNAL[backend.name] = replace(backend, origin="entry_point")


def _adapter(name: str) -> Backend | None:
    from rl_engine.backends import adapters

    if name not in adapters.ADAPTERS:
        return None
    try:
        backend = replace(adapters.load(name), origin="adapter")
    except BackendUnavailable as exc:  # its library is missing: it exists, and says why it cannot run
        backend = _failed(name, "adapter", str(exc))
    _EXTERNAL[name] = backend
    return backend


def backend_names() -> list[str]:
    """Every backend name known here: the built-ins, then the external ones (adapters included)."""
    _load_entry_points()
    from rl_engine.backends import adapters

    return list(BACKENDS) + sorted(set(_EXTERNAL) | set(adapters.ADAPTERS))


def get_backend(name: str, contract: Contract | None = None) -> Backend:
    """The :class:`Backend` called ``name`` (an adapter is imported only when asked for).

    Raises
    ------
    ContractError
        ``contract`` given and the name is a target it declares out of scope.
    RLEngineError
        An unknown name; the message lists the valid ones.
    """
    if name in _BUILTIN:
        return _BUILTIN[name]
    _load_entry_points()
    found = _EXTERNAL.get(name) or _adapter(name)
    if found is not None:
        return found
    if contract is not None:
        out_of_scope = contract.data["backend_profiles"]["out_of_scope"]
        if any(key in name.lower() for key in out_of_scope):
            contract.check_backend_profile(name)  # raises ContractError naming why it is out of scope
            raise ContractError(f"backend {name!r} is out of scope")  # pragma: no cover - the line above raises
    raise RLEngineError(f"unknown backend {name!r}; valid: {', '.join(backend_names())}")


def external_backend(name: str) -> Backend | None:
    """The external :class:`Backend` called ``name``, or ``None`` for a built-in one."""
    return None if name in _BUILTIN else get_backend(name)


# -- the functions the ops and the tools call -------------------------------------------------------
def availability(backend: str) -> tuple[bool, str]:
    """``(can_run, reason)`` for a backend on this machine (cached per process)."""
    try:
        return get_backend(backend).available()
    except RLEngineError:
        return False, f"unknown backend {backend!r}"


def check_backend(backend: str, contract: Contract | None = None) -> Backend:
    """The backend, after checking that it is known and can run here.

    Raises
    ------
    BackendUnavailable
        It cannot run here; the message says why.
    RLEngineError, ContractError
        See :func:`get_backend`.
    """
    b = get_backend(backend, contract)
    ok, why = b.available()
    if not ok:
        raise BackendUnavailable(f"backend {backend} cannot run here: {why}")
    return b


def available_backends(kernel_only: bool = True) -> list[str]:
    names = KERNEL_BACKENDS if kernel_only else BACKENDS
    return [b for b in names if _BUILTIN[b].available()[0]]


def resolve_impl(op: str, backend: str) -> Callable[..., Any]:
    """The implementation of ``op`` on ``backend``, after checking (once per process) that the
    backend can run. Raises as :func:`check_backend` and :meth:`Backend.impl`."""
    return check_backend(backend).impl(op)
