"""Public entry points of ``embedding``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.embedding.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.embedding.op import *  # noqa: F401,F403 - the op's public names


def embedding(ids: torch.Tensor, weight: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Row gather ``weight[ids]``. ids: [T] int64, weight: [V, E] bfloat16 -> [T, E] bfloat16.

    Every output row is an exact copy of a weight row. Every id must lie in ``[0, V)``; on the
    kernel backends anything else raises :class:`~rl_engine.errors.InputError` before a launch
    (``docs/pitfalls.md``, P9; ``torch_bf16`` and ``reference_fp32`` are unvalidated comparison
    paths). Backward: the gradient of ``weight`` ([V, E] bfloat16) as sorted segment sums in FP32,
    no atomics. For a capture-safe call without the id-range check see :func:`embedding_kernel`.

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("embedding", backend)(ids=ids, weight=weight)
