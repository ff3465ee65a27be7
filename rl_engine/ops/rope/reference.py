"""FP32 reference for RoPE (WS1 §3.1). Math: Su et al. 2021 (RoFormer), rotate-half form of
Hugging Face Qwen3 ``apply_rotary_pos_emb``; cos/sin are the FP32 tables of ``cos_sin``."""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] float32 (upcast BF16 values), cos/sin: [T, D/2] float32 -> [T, H, D] float32."""
    require_fp32(x=x, cos=cos, sin=sin)
    with fp32_reference_guard():
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
