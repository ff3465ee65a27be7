"""FP32 reference for QK-norm (WS1 §3.1): the RMSNorm reference over the last axis D of
[T, H, D] (Hugging Face Qwen3RMSNorm applied to ``q.view(T, H, D)``). Never imports a kernel."""

import torch

from rl_engine.ops.rms_norm.reference import rms_norm_reference


def qk_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """x: [T, H, D] float32, weight: [D] float32 -> [T, H, D] float32."""
    return rms_norm_reference(x, weight, eps, order)
