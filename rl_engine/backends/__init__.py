"""Backend registry: explicit selection, availability with a reason, no silent fallback."""

from rl_engine.backends.registry import (
    BACKENDS,
    availability,
    available_backends,
    check_backend,
    resolve_impl,
)

__all__ = ["BACKENDS", "availability", "available_backends", "check_backend", "resolve_impl"]
