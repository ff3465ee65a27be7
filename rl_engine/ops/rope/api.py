"""Public entry points of ``rope``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.rope.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.rope.op import *  # noqa: F401,F403 - the op's public names


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Rotate-half RoPE. x: [T, H, D] bfloat16, cos/sin: [T, D/2] float32 -> [T, H, D] bfloat16.

    ``out = [x1*cos - x2*sin, x2*cos + x1*sin]`` with ``x1 = x[..., :D/2]``, ``x2 = x[..., D/2:]``
    (Hugging Face Qwen3 ``apply_rotary_pos_emb``); FP32 math, one rounding. Backward: dx.

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("rope", backend)(x=x, cos=cos, sin=sin)
