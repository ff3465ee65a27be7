"""Backend registry: explicit selection, availability with a reason, no silent fallback."""

from rl_engine.backends.registry import (
    BACKENDS,
    KERNEL_BACKENDS,
    Backend,
    availability,
    available_backends,
    check_backend,
    get_backend,
    register_backend,
    resolve_impl,
)

__all__ = ["BACKENDS", "KERNEL_BACKENDS", "Backend", "availability", "available_backends", "check_backend",
           "get_backend", "register_backend", "resolve_impl"]
