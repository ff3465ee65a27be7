"""Public entry points of ``lm_head``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.lm_head.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.lm_head.op import *  # noqa: F401,F403 - the op's public names


def lm_head(hidden: torch.Tensor, weight: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Logits ``hidden @ weight^T``. hidden: [T, E] bfloat16, weight: [V, E] bfloat16 -> logits [T, V]
    **float32**.

    FP32 accumulation over the whole E axis, written as FP32: logits are never rounded to BF16
    (contract ``declared_exceptions.logits_for_scoring``, ``docs/pitfalls.md``, P5). Gradients
    (upstream FP32): dhidden [T, E] and dweight [V, E], bfloat16, computed in FP32. ``backend`` is
    explicit; an unavailable backend raises BackendUnavailable naming why; on the kernel backends,
    bad inputs raise InputError before any launch (``torch_bf16`` and ``reference_fp32`` are
    unvalidated comparison paths, docs/ops-api.md).
    """
    return resolve_impl("lm_head", backend)(hidden=hidden, weight=weight)
