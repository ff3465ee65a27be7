"""FP32 reference for RMSNorm (WS1 §3.1). Math: Zhang & Sennrich 2019; Hugging Face
Qwen3RMSNorm: ``weight * x * rsqrt(mean(x^2, -1) + eps)``, here entirely in FP32 (no rounding, so
the rounding ``order`` does not change the reference; it is validated and ignored). Gradients
follow from the same FP32 definition through autograd."""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32

ORDERS = ("hf", "fused")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """x: [T, E] (or [T, H, D]) float32, weight: [E] float32 -> same shape as x, float32."""
    require_fp32(x=x, weight=weight)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    with fp32_reference_guard():
        var = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(var + eps) * weight
