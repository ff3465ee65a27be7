"""SiLU in plain PyTorch BF16, as Hugging Face's ``ACT2FN["silu"]`` runs it."""

import torch
import torch.nn.functional as F


def silu_torch_bf16(x: torch.Tensor) -> torch.Tensor:
    """x: [T, F] bfloat16 -> [T, F] bfloat16 (``torch.nn.functional.silu``)."""
    return F.silu(x)
