"""Public entry points of ``silu``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.silu.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.silu.op import *  # noqa: F401,F403 - the op's public names


def silu(x: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """SiLU ``x * sigmoid(x)``. x: [T, F] bfloat16 -> [T, F] bfloat16 (FP32 math inside).

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("silu", backend)(x=x)
