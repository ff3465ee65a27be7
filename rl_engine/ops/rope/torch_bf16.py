"""RoPE in plain PyTorch BF16, as Hugging Face Qwen3 runs it.

Hugging Face concatenates the FP32 cos/sin tables to width D, casts them to the activation dtype
(BF16), then computes ``x * cos + rotate_half(x) * sin`` in BF16 (every product and the sum
rounded to BF16).
"""

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_torch_bf16(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] bfloat16, cos/sin: [T, D/2] float32 -> [T, H, D] bfloat16."""
    c = torch.cat((cos, cos), dim=-1).to(x.dtype)[:, None, :]
    s = torch.cat((sin, sin), dim=-1).to(x.dtype)[:, None, :]
    return (x * c) + (_rotate_half(x) * s)
