"""SwiGLU in plain PyTorch BF16, as Hugging Face's Qwen3MLP runs it: ``act_fn(gate) * up``."""

import torch
import torch.nn.functional as F


def swiglu_torch_bf16(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up: [T, F] bfloat16 -> [T, F] bfloat16 (silu rounded to BF16, then the BF16 product)."""
    return F.silu(gate) * up
