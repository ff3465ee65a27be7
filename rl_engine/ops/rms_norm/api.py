"""Public entry point for RMSNorm."""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *,
             backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """RMSNorm over E. x: [T, E] bfloat16, weight: [E] bfloat16 -> [T, E] bfloat16.

    ``eps`` has no default: it comes from the model config (Qwen3: 1e-6; pitfall P12).
    ``order`` (contract ``declared_exceptions.rms_norm_rounding_order``): ``"hf"`` =
    ``bf16(weight * bf16(x * rsqrt(mean(x^2) + eps)))`` (Hugging Face Qwen3RMSNorm, the declared
    order); ``"fused"`` = ``bf16(x * rsqrt(mean(x^2) + eps) * weight)``, one rounding. Statistics
    in FP32. Backward: dx [T, E] and dweight [E] bfloat16 from the FP32 definition.

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("rms_norm", backend)(x=x, weight=weight, eps=eps, order=order)
