"""RMSNorm in plain PyTorch, as Hugging Face ``Qwen3RMSNorm.forward`` runs it.

``hf``: upcast to FP32, ``variance = x.pow(2).mean(-1)``, ``x * rsqrt(variance + eps)``, cast to
BF16, then ``weight * that`` in BF16. ``fused``: the same FP32 statistics, weight multiplied in
FP32, one cast to BF16.
"""

import torch


def rms_norm_torch_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """x: [T, E] (or [T, H, D]) bfloat16, weight: [E] bfloat16 -> same shape as x, bfloat16."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    if order == "hf":
        return weight * h.to(input_dtype)
    if order == "fused":
        return (h * weight.to(torch.float32)).to(input_dtype)
    raise ValueError(f"order must be 'hf' or 'fused', got {order!r}")
