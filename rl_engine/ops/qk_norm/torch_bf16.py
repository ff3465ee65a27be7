"""QK-norm in plain PyTorch BF16, as Hugging Face Qwen3Attention runs ``q_norm`` / ``k_norm``:
Qwen3RMSNorm over the last axis of ``q_proj(x).view(T, H, D)``."""

import torch

from rl_engine.ops.rms_norm.torch_bf16 import rms_norm_torch_bf16


def qk_norm_torch_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """x: [T, H, D] bfloat16, weight: [D] bfloat16 -> [T, H, D] bfloat16."""
    return rms_norm_torch_bf16(x, weight, eps, order)
