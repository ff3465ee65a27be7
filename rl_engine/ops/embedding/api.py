"""Public entry point for the token embedding."""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl


def embedding(ids: torch.Tensor, weight: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Row gather ``weight[ids]``. ids: [T] int64, weight: [V, E] bfloat16 -> [T, E] bfloat16.

    Every output row is an exact copy of a weight row. Every id must lie in ``[0, V)``; on the
    kernel backends anything else raises :class:`~rl_engine.errors.InputError` before a launch
    (pitfall P9; ``torch_bf16`` and ``reference_fp32`` are unvalidated comparison paths). Backward:
    the gradient of ``weight`` ([V, E] bfloat16) as sorted segment sums in FP32, no atomics.

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("embedding", backend)(ids=ids, weight=weight)
