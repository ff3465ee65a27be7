"""The one backend type: a frozen :class:`Backend`, for built-in and external backends alike.

A backend has a name, a probe that says whether it can run here (``available() -> (ok, reason)``,
worked out once per process and cached) and an op table: its own for an external backend, the
op rooms' ``SPEC.impls`` for a built-in one. The registry of the backends that exist is
:mod:`rl_engine.backends.registry`; this module only defines the type (so the shipped adapters
can build one without importing the registry that loads them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rl_engine.constants import OPS
from rl_engine.errors import BackendUnavailable, RLEngineError

BUILTIN_NAMES = ("reference_fp32", "torch_bf16", "triton_cuda_bf16", "cuda_bf16")
DECODE_OP = "attention_decode"
"""The one entry point besides the 13 ops: one decode step against a static KV cache (the chain's
decode calls it; the attention op's room holds its implementations in ``DECODE_IMPLS``)."""

ORIGINS = ("builtin", "python", "entry_point", "adapter")


def _always() -> tuple[bool, str]:
    return True, "PyTorch runs everywhere"


@dataclass(frozen=True)
class Backend:
    """One backend: its name, how to tell whether it can run here, and where its ops live.

    ``ops`` is the backend's own op table (external backends); ``None`` for a built-in backend,
    whose implementations live in the op rooms (``rl_engine/ops/<op>/spec.py``, ``SPEC.impls``).
    ``backward`` and ``batch_invariant`` name the ops whose backward it provides and for which it
    claims bitwise batch invariance (a built-in backend provides and claims every op). ``probe``
    returns ``(can_run, reason)``; call :meth:`available`, which runs it once per process.

    Raises
    ------
    RLEngineError
        On construction: an empty name, an unknown origin, op names outside ``rl_engine.OPS``,
        an empty op table, or ``backward`` / ``batch_invariant`` naming ops the table lacks.
    """

    name: str
    probe: Callable[[], tuple[bool, str]] = _always
    ops: Mapping[str, Callable[..., Any]] | None = None
    backward: frozenset[str] = frozenset()
    batch_invariant: frozenset[str] = frozenset()
    kernel: bool = False
    """Judged by the gate (``triton_cuda_bf16``, ``cuda_bf16`` and every external backend)."""
    origin: str = "builtin"
    """``builtin``, ``python`` (:func:`register_backend` in this process), ``entry_point`` or ``adapter``."""
    description: str = ""
    _cache: dict[str, tuple[bool, str]] = field(default_factory=dict, init=False, compare=False, repr=False)
    """The probe's answer once asked (the one mutable part: a cache, not an identity)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RLEngineError(f"a backend needs a non-empty name, got {self.name!r}")
        if self.origin not in ORIGINS:
            raise RLEngineError(f"backend {self.name!r}: origin {self.origin!r} is not one of {ORIGINS}")
        object.__setattr__(self, "backward", frozenset(self.backward))
        object.__setattr__(self, "batch_invariant", frozenset(self.batch_invariant))
        if self.ops is None:
            return
        unknown = sorted(set(self.ops) - set(OPS))
        if unknown:
            raise RLEngineError(f"backend {self.name!r}: unknown op(s) {unknown}; valid: {', '.join(OPS)}")
        for label, names in (("backward", self.backward), ("batch_invariant", self.batch_invariant)):
            extra = sorted(names - set(self.ops))
            if extra:
                raise RLEngineError(f"backend {self.name!r}: {label} names ops it does not provide: {extra}")
        object.__setattr__(self, "ops", MappingProxyType(dict(self.ops)))

    @property
    def builtin(self) -> bool:
        return self.origin == "builtin"

    def available(self) -> tuple[bool, str]:
        """``(can_run, reason)`` on this machine, probed on the first call and then cached."""
        if "answer" not in self._cache:
            self._cache["answer"] = self.probe()
        return self._cache["answer"]

    def provides(self, op: str) -> bool:
        """Whether the backend implements ``op`` (built-ins: every op whose room lists it)."""
        if self.ops is not None:
            return op in self.ops
        try:
            self.impl(op)
        except BackendUnavailable:
            return False
        return True

    def impl(self, op: str) -> Callable[..., Any]:
        """The implementation of ``op`` (one of ``rl_engine.OPS`` or ``attention_decode``).

        Looked up in the op's room on every call (a dictionary lookup), so that a test that swaps
        ``SPEC.impls[backend]`` is seen at once. Does not check availability: see :func:`resolve_impl`.

        Raises
        ------
        BackendUnavailable
            The backend has no implementation of ``op``.
        RLEngineError
            ``op`` is not an op name.
        """
        if self.ops is not None:
            fn = self.ops.get(op)
            if fn is None:
                raise BackendUnavailable(f"backend {self.name} does not provide {op}")
            return fn
        if op == DECODE_OP:
            from rl_engine.ops.attention.spec import DECODE_IMPLS

            table = DECODE_IMPLS
        else:
            from rl_engine.ops.registry import get_spec

            table = get_spec(op).impls
        if self.name not in table:
            raise BackendUnavailable(f"op {op} has no {self.name} implementation")
        return table[self.name]


def _as_names(value: bool | Iterable[str] | None, ops: Iterable[str]) -> frozenset[str]:
    if value is True:
        return frozenset(ops)
    if value is False or value is None:
        return frozenset()
    return frozenset(value)


def plugin_backend(name: str, ops: Mapping[str, Callable[..., Any]], *, backward: bool | Iterable[str] = (),
                   batch_invariant: bool | Iterable[str] = (), description: str = "",
                   available: Callable[[], tuple[bool, str]] | None = None, origin: str = "python") -> Backend:
    """An external :class:`Backend` from an op table (``backward`` / ``batch_invariant``: op names,
    or ``True`` for every op of the table). ``available`` is its probe (default: can always run).

    Raises
    ------
    RLEngineError
        A name taken by a built-in backend, an empty op table, or what :class:`Backend` rejects.
    """
    if name in BUILTIN_NAMES:
        raise RLEngineError(f"backend name {name!r} is taken by a built-in backend")
    if not ops:
        raise RLEngineError(f"backend {name!r} provides no op")

    def probe() -> tuple[bool, str]:
        return (True, f"plugin backend {name}") if available is None else available()

    return Backend(name, probe, dict(ops), _as_names(backward, ops), _as_names(batch_invariant, ops),
                   kernel=True, origin=origin, description=description)


