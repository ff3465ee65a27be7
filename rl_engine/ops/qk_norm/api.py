"""Public entry point for QK-norm."""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *,
            backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """RMSNorm over D per (token, head). x: [T, H, D] bfloat16, weight: [D] bfloat16 -> [T, H, D] bfloat16.

    Same math, eps rule (no default, pitfall P12) and rounding orders as
    :func:`rl_engine.ops.rms_norm.rms_norm`, applied to each of the T*H rows of length D (Hugging
    Face Qwen3Attention ``q_norm`` / ``k_norm``). Backward: dx [T, H, D] and dweight [D] bfloat16
    (summed over all T*H rows). ``backend`` is explicit; an unavailable backend raises
    BackendUnavailable naming why.
    """
    return resolve_impl("qk_norm", backend)(x=x, weight=weight, eps=eps, order=order)
