"""Token embedding: ``out[t] = weight[ids[t]]``.

Public function: :func:`embedding` (selects a backend explicitly).
"""

from rl_engine.ops.embedding.api import embedding

__all__ = ["embedding"]
