"""Plain values every layer of the package may import: the version and the list of the ops.

This module imports nothing, so that no module inside the package needs the package root
``rl_engine/__init__.py`` (the public facade, which re-exports these): importing the root from
inside made it part of import cycles (tests/test_import_graph.py).
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
