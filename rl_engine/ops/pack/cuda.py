"""CUDA C++ pack / unpack (``cuda_bf16`` backend), forward and backward (each is the other's backward).

Kernels ``rl_pack`` / ``rl_unpack`` in ``rl_engine/backends/cuda_src/elementwise.cu``. pack: one
block per (packed row t, 1024 columns) reads ``b = seq_of_row[t]`` (built on the host from
``cu_seqlens``), ``s = t - cu_seqlens[b]`` and copies the BF16 bits of ``x[b, s]``. unpack: one
block per (padded row ``b*S + s``, column block) copies packed row ``cu_seqlens[b] + s`` when
``s < L_b`` and writes exact zeros otherwise. No arithmetic: every output row is an exact copy.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch


def pack_rows(x: torch.Tensor, cu: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """y [sum(lengths), E] bf16: rows x[b, :lengths[b]] of validated x [B, S, E] (cu int32 [B+1], contiguous)."""
    e = x.shape[2]
    total = sum(lengths)
    y = torch.empty((total, e), dtype=torch.bfloat16, device=x.device)
    if total and e:
        seq = torch.repeat_interleave(
            torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths, dtype=torch.int64)
        ).to(x.device)
        launch(x.device, "rl_pack", x, cu, seq, y, total, e, x.stride(0), x.stride(1), y.stride(0))
    return y


def unpack_rows(x: torch.Tensor, cu: torch.Tensor, n_seqs: int, seq_len: int) -> torch.Tensor:
    """y [n_seqs, seq_len, E] bf16 from packed x [T, E]: exact row copies, exact zeros in the padding."""
    e = x.shape[1]
    y = torch.empty((n_seqs, seq_len, e), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_unpack", x, cu, y, n_seqs, seq_len, e, x.stride(0), y.stride(0), y.stride(1))
    return y
