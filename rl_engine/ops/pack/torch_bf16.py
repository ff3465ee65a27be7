"""pack / unpack in plain PyTorch BF16, as Hugging Face's flash-attention varlen path does it:
boolean-mask indexing of the padded tensor (``unpad_input``) and a masked scatter back
(``pad_input``). Mask: ``mask[b, s] = s < L_b``."""

import torch


def _mask(cu_seqlens: torch.Tensor, S: int, device: torch.device) -> torch.Tensor:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(device)
    return torch.arange(S, device=device)[None, :] < lengths[:, None]


def pack_torch_bf16(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """x: [B, S, E] bfloat16, cu_seqlens: [B+1] int32 -> [T, E] bfloat16."""
    return x[_mask(cu_seqlens, x.shape[1], x.device)]


def unpack_torch_bf16(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int) -> torch.Tensor:
    """x: [T, E] bfloat16, cu_seqlens: [B+1] int32, S -> [B, S, E] bfloat16 (zeros in the padding)."""
    mask = _mask(cu_seqlens, S, x.device)
    out = x.new_zeros((mask.shape[0], S, x.shape[-1]))
    out[mask] = x
    return out
