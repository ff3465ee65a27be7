"""det_gemm in plain PyTorch BF16: ``a @ b`` (cuBLAS on a GPU), as Hugging Face's nn.Linear runs it."""

import torch


def det_gemm_torch_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a: [M, K] bfloat16, b: [K, N] bfloat16 -> [M, N] bfloat16 (``torch.matmul``; not batch-invariant)."""
    return a @ b
