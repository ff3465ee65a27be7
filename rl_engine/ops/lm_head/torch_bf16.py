"""lm_head in plain PyTorch BF16, as Hugging Face runs it: BF16 logits, then ``.float()``."""

import torch


def lm_head_torch_bf16(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden: [T, E] bfloat16, weight: [V, E] bfloat16 -> logits [T, V] float32.

    ``(hidden @ weight.T).float()``: the product is rounded to BF16 before the upcast (the P5
    behaviour the kernels avoid); cuBLAS on a GPU.
    """
    return (hidden @ weight.t()).float()
