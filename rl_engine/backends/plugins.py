"""External backends: judge any kernel under the same contract.

Register an implementation for any subset of the 13 ops, from Python::

    import rl_engine
    rl_engine.register_backend("my_kernels", {"rms_norm": my_rms_norm}, backward={"rms_norm"},
                               batch_invariant=True)

or from a package, through the entry-point group ``rl_engine.backends`` whose entry points load
to a :class:`BackendPlugin` (or a zero-argument callable returning one). Each implementation has
the signature of the op in ``docs/ops-api.md``. The gate then judges the backend: ops it does not
provide show as ``not provided``; a direction (backward) it does not provide likewise; invariance
is judged only where the backend claims batch invariance (a claim it makes and fails is red).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rl_engine import OPS
from rl_engine.errors import RLEngineError

ENTRY_POINT_GROUP = "rl_engine.backends"


@dataclass
class BackendPlugin:
    """A backend provided from outside the package."""

    name: str
    ops: dict[str, Callable[..., Any]]
    backward: set[str] = field(default_factory=set)
    """Ops whose implementation supports autograd (gradient cells are judged only for these)."""
    batch_invariant: set[str] = field(default_factory=set)
    """Ops for which the backend claims bitwise invariance (invariance cells judged only for these)."""
    description: str = ""
    available: Callable[[], tuple[bool, str]] | None = None
    origin: str = "python"
    """``python`` (register_backend in this process), ``entry_point`` or ``adapter``."""

    def availability(self) -> tuple[bool, str]:
        if self.available is None:
            return True, f"plugin backend {self.name}"
        return self.available()


_REGISTERED: dict[str, BackendPlugin] = {}
_ENTRY_POINTS_LOADED = False


def _as_set(value: bool | Iterable[str], ops: Iterable[str]) -> set[str]:
    if value is True:
        return set(ops)
    if value is False or value is None:
        return set()
    return set(value)


def register_backend(name: str, ops: dict[str, Callable[..., Any]], *, backward: bool | Iterable[str] = (),
                     batch_invariant: bool | Iterable[str] = (), description: str = "",
                     available: Callable[[], tuple[bool, str]] | None = None) -> BackendPlugin:
    """Register an external backend for the gate.

    ``ops`` maps op names (any subset of ``rl_engine.OPS``) to callables with the op's API.
    ``backward`` and ``batch_invariant`` are op names (or ``True`` for all registered ops).

    Raises
    ------
    RLEngineError
        Unknown op names, a name that clashes with a built-in backend, or an empty op table.
    """
    from rl_engine.backends.registry import BACKENDS

    if name in BACKENDS:
        raise RLEngineError(f"backend name {name!r} is taken by a built-in backend")
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise RLEngineError(f"backend {name!r}: unknown op(s) {unknown}; valid: {', '.join(OPS)}")
    if not ops:
        raise RLEngineError(f"backend {name!r} provides no op")
    bw, bi = _as_set(backward, ops), _as_set(batch_invariant, ops)
    for label, names in (("backward", bw), ("batch_invariant", bi)):
        extra = sorted(names - set(ops))
        if extra:
            raise RLEngineError(f"backend {name!r}: {label} names ops it does not provide: {extra}")
    plugin = BackendPlugin(name, dict(ops), bw, bi, description, available)
    _REGISTERED[name] = plugin
    return plugin


def unregister_backend(name: str) -> None:
    _REGISTERED.pop(name, None)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTERED:
            continue
        try:
            obj = ep.load()
            plugin = obj() if callable(obj) and not isinstance(obj, BackendPlugin) else obj
        except Exception as exc:  # a broken third-party plugin must not break the tool
            _REGISTERED[ep.name] = BackendPlugin(ep.name, {}, available=lambda exc=exc: (False, f"entry point failed to load: {exc}"))
            continue
        if isinstance(plugin, BackendPlugin):
            plugin.origin = "entry_point"
            _REGISTERED[plugin.name] = plugin


def get_plugin(name: str) -> BackendPlugin | None:
    """A registered or entry-point backend, or a shipped adapter (imported only when asked for)."""
    _load_entry_points()
    if name in _REGISTERED:
        return _REGISTERED[name]
    from rl_engine.backends import adapters

    if name in adapters.ADAPTERS:
        plugin = adapters.load(name)  # raises BackendUnavailable when its library is missing
        plugin.origin = "adapter"
        _REGISTERED[name] = plugin
        return plugin
    return None


def plugin_names() -> list[str]:
    _load_entry_points()
    from rl_engine.backends import adapters

    return sorted(set(_REGISTERED) | set(adapters.ADAPTERS))
