"""FP32 reference for pack / unpack (WS1 §3.1): plain slicing and concatenation, no arithmetic."""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def _lengths(cu_seqlens: torch.Tensor) -> list[int]:
    cu = [int(v) for v in cu_seqlens.tolist()]
    return [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]


def pack_reference(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """x: [B, S, E] float32, cu_seqlens: [B+1] int32 -> [T, E] float32 (rows ``x[b, :L_b]`` in order)."""
    require_fp32(x=x)
    with fp32_reference_guard():
        rows = [x[b, :n] for b, n in enumerate(_lengths(cu_seqlens))]
        return torch.cat(rows, 0) if rows else x.new_zeros((0, x.shape[-1]))


def unpack_reference(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int) -> torch.Tensor:
    """x: [T, E] float32, cu_seqlens: [B+1] int32, S -> [B, S, E] float32 (zeros in the padding)."""
    require_fp32(x=x)
    with fp32_reference_guard():
        lengths = _lengths(cu_seqlens)
        rows = []
        start = 0
        for n in lengths:
            pad = x.new_zeros((S - n, x.shape[-1]))
            rows.append(torch.cat([x[start:start + n], pad], 0))
            start += n
        return torch.stack(rows, 0) if rows else x.new_zeros((0, S, x.shape[-1]))
