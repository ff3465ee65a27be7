"""Token embedding in plain PyTorch BF16, as Hugging Face's ``nn.Embedding`` runs it."""

import torch
import torch.nn.functional as F


def embedding_torch_bf16(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """ids: [T] int64, weight: [V, E] bfloat16 -> [T, E] bfloat16 (``torch.nn.functional.embedding``)."""
    return F.embedding(ids, weight)
