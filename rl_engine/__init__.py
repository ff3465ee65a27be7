"""rl_engine: numerically trustworthy kernels and the WS1 precision gate for LLM RL.

Nothing happens at import: no environment reads that switch code paths, no builds, no global
torch flags and no seeds. See ``rl_engine.env`` for the environment variables the package reads.
"""

__version__ = "0.1.0"

OPS = (
    "embedding",
    "rope",
    "silu",
    "swiglu",
    "pack",
    "rms_norm",
    "qk_norm",
    "lm_head",
    "det_gemm",
    "attention",
    "logp",
    "linear_logp",
    "batch_invariant_logp",
)
"""The 13 required ops, in the order they appear in a Qwen3 dense forward pass (model op order)."""



def register_backend(*args, **kwargs):
    """Register an external backend for the gate; see :func:`rl_engine.backends.plugins.register_backend`."""
    from rl_engine.backends.plugins import register_backend as _register

    return _register(*args, **kwargs)


__all__ = ["OPS", "__version__", "register_backend"]
