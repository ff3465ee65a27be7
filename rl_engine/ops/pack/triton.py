"""Triton pack / unpack, forward and backward (each one is the other's backward).

pack: one program per (packed row t, block of ``BLOCK`` columns). The host builds ``seq_of_row``
[T] int32 (the sequence of each packed row, from ``cu_seqlens``); the program reads
``b = seq_of_row[t]``, ``s = t - cu_seqlens[b]`` and copies ``x[b, s]``. unpack: one program per
(padded row b*S + s, column block) copies packed row ``cu_seqlens[b] + s`` when ``s < L_b`` and
writes exact zeros otherwise, so every output element is written. Values move as BF16 bits
(no conversion): every output row is an exact copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv

BLOCK = 1024


@triton.jit
def _pack_kernel(x_ptr, cu_ptr, seq_ptr, y_ptr, n_cols, stride_xb, stride_xs, stride_y, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    b = tl.load(seq_ptr + t)
    s = t - tl.load(cu_ptr + b)
    src = x_ptr + b.to(tl.int64) * stride_xb + s.to(tl.int64) * stride_xs + cols
    vals = tl.load(src, mask=mask, other=0.0)
    tl.store(y_ptr + t.to(tl.int64) * stride_y + cols, vals, mask=mask)


@triton.jit
def _unpack_kernel(x_ptr, cu_ptr, y_ptr, n_cols, seq_len, stride_x, stride_yb, stride_ys, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    b = r // seq_len
    s = r % seq_len
    start = tl.load(cu_ptr + b)
    length = tl.load(cu_ptr + b + 1) - start
    mask = cols < n_cols
    src = x_ptr + (start + s).to(tl.int64) * stride_x + cols
    valid = (tl.zeros((BLOCK,), dtype=tl.int32) + s) < length  # a block-shaped mask (interpreter-safe)
    vals = tl.load(src, mask=mask & valid, other=0.0)
    dst = y_ptr + b.to(tl.int64) * stride_yb + s.to(tl.int64) * stride_ys + cols
    tl.store(dst, vals, mask=mask)


def pack_rows(x: torch.Tensor, cu: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """y [sum(lengths), E] bf16: rows x[b, :lengths[b]] of validated x [B, S, E] (cu int32 [B+1], contiguous)."""
    e = x.shape[2]
    total = sum(lengths)
    y = torch.empty((total, e), dtype=torch.bfloat16, device=x.device)
    if total and e:
        seq = torch.repeat_interleave(
            torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths, dtype=torch.int64)
        ).to(x.device)
        _pack_kernel[(total, cdiv(e, BLOCK))](
            x, cu, seq, y, e, x.stride(0), x.stride(1), y.stride(0), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return y


def unpack_rows(x: torch.Tensor, cu: torch.Tensor, n_seqs: int, seq_len: int) -> torch.Tensor:
    """y [n_seqs, seq_len, E] bf16 from packed x [T, E]: exact row copies, exact zeros in the padding."""
    e = x.shape[1]
    y = torch.empty((n_seqs, seq_len, e), dtype=torch.bfloat16, device=x.device)
    if n_seqs and seq_len and e:
        _unpack_kernel[(n_seqs * seq_len, cdiv(e, BLOCK))](
            x, cu, y, e, seq_len, x.stride(0), y.stride(0), y.stride(1), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return y
