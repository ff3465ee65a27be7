"""Public entry point for ``logp``."""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl


def logp(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    backend: str = "triton_cuda_bf16",
) -> torch.Tensor:
    """Log-probability of each target token: ``log_softmax(logits / temperature)[targets]``.

    logits: [T, V] float32 (never rounded to BF16), targets: [T] int64 in [0, V),
    temperature: finite float > 0 -> [T] float32. FP32 max, sum-exp and output (pitfalls P4, P11).
    Gradient: logits. ``backend`` is explicit; an unavailable backend raises BackendUnavailable
    naming why. On the kernel backends, bad inputs raise InputError
    before any launch (``torch_bf16`` and ``reference_fp32`` are unvalidated comparison paths,
    docs/ops-api.md).
    """
    return resolve_impl("logp", backend)(logits=logits, targets=targets, temperature=temperature)
