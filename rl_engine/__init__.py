"""rl_engine: numerically trustworthy kernels and the WS1 precision gate for LLM RL.

Nothing happens at import: no environment reads that switch code paths, no builds, no global
torch flags and no seeds. See ``rl_engine.env`` for the environment variables the package reads.

This module is the public facade: modules inside the package never import it (they take ``OPS``
and ``__version__`` from :mod:`rl_engine.constants`), which keeps it out of every import cycle.
"""

from rl_engine.constants import OPS, __version__


def register_backend(*args, **kwargs):
    """Register an external backend for the gate; see :func:`rl_engine.backends.registry.register_backend`."""
    from rl_engine.backends.registry import register_backend as _register

    return _register(*args, **kwargs)


__all__ = ["OPS", "__version__", "register_backend"]
