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

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import FP_FUSION, check_triton_device
from rl_engine.ops._validate import check_cu_seqlens, check_same_device, check_tensor

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


def _launch_pack(x: torch.Tensor, cu: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    e = x.shape[2]
    total = sum(lengths)
    y = torch.empty((total, e), dtype=torch.bfloat16, device=x.device)
    if total and e:
        seq = torch.repeat_interleave(
            torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths, dtype=torch.int64)
        ).to(x.device)
        _pack_kernel[(total, triton.cdiv(e, BLOCK))](
            x, cu, seq, y, e, x.stride(0), x.stride(1), y.stride(0), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return y


def _launch_unpack(x: torch.Tensor, cu: torch.Tensor, n_seqs: int, seq_len: int) -> torch.Tensor:
    e = x.shape[1]
    y = torch.empty((n_seqs, seq_len, e), dtype=torch.bfloat16, device=x.device)
    if n_seqs and seq_len and e:
        _unpack_kernel[(n_seqs * seq_len, triton.cdiv(e, BLOCK))](
            x, cu, y, e, seq_len, x.stride(0), y.stride(0), y.stride(1), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return y


def _check_lengths(cu_seqlens: torch.Tensor, n_seqs: int | None, total: int | None, seq_len: int) -> list[int]:
    check_tensor("cu_seqlens", cu_seqlens, dtype=torch.int32, ndim=1)
    if cu_seqlens.numel() < 1:
        raise InputError("cu_seqlens: expected at least one entry [B+1], got an empty tensor")
    if n_seqs is not None and cu_seqlens.numel() != n_seqs + 1:
        raise InputError(f"cu_seqlens: expected shape [B+1] = [{n_seqs + 1}], got {list(cu_seqlens.shape)}")
    if total is None:
        total = int(cu_seqlens[-1])
    cu = check_cu_seqlens("cu_seqlens", cu_seqlens, total)
    lengths = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    for b, n in enumerate(lengths):
        if n > seq_len:
            raise InputError(f"cu_seqlens: sequence {b} has length {n} > S = {seq_len}")
    return lengths


class _PackTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cu, lengths):
        ctx.save_for_backward(cu)
        ctx.seq_len = x.shape[1]
        ctx.n_seqs = x.shape[0]
        return _launch_pack(x, cu, lengths)

    @staticmethod
    def backward(ctx, dy):
        (cu,) = ctx.saved_tensors
        dy = dy.to(torch.bfloat16)
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        return _launch_unpack(dy, cu, ctx.n_seqs, ctx.seq_len), None, None


class _UnpackTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cu, lengths, seq_len):
        ctx.save_for_backward(cu)
        ctx.lengths = lengths
        return _launch_unpack(x, cu, len(lengths), seq_len)

    @staticmethod
    def backward(ctx, dy):
        (cu,) = ctx.saved_tensors
        dy = dy.to(torch.bfloat16)
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        return _launch_pack(dy, cu, ctx.lengths), None, None, None


def pack_triton(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Padded -> packed with Triton. x: [B, S, E] bfloat16, cu_seqlens: [B+1] int32 -> [T, E] bfloat16.

    Exact row copies (no arithmetic). Backward: dx [B, S, E] bfloat16 = unpack(dy), zeros in the
    padding. Any strides on B and S are accepted; E needs unit stride.

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on E; cu_seqlens is not int32 [B+1],
        starting at 0 and non-decreasing; a sequence is longer than S; devices differ.
    BackendUnavailable
        The tensors are not on a CUDA device (and the Triton interpreter is off).
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=3, contiguous_last=True)
    lengths = _check_lengths(cu_seqlens, x.shape[0], None, x.shape[1])
    check_same_device(x=x, cu_seqlens=cu_seqlens)
    check_triton_device(x, cu_seqlens)
    return _PackTriton.apply(x, cu_seqlens, lengths)


def unpack_triton(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int) -> torch.Tensor:
    """Packed -> padded with Triton. x: [T, E] bfloat16, cu_seqlens: [B+1] int32, S -> [B, S, E] bfloat16.

    Exact row copies, exact zeros in the padding. Backward: dx [T, E] bfloat16 = pack(dy).

    Raises
    ------
    InputError
        x is not a 2-D bfloat16 tensor with unit stride on E; cu_seqlens is not int32 [B+1],
        starting at 0, non-decreasing and ending at T; S is not a non-negative int or a sequence is
        longer than S; devices differ.
    BackendUnavailable
        The tensors are not on a CUDA device (and the Triton interpreter is off).
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if isinstance(S, bool) or not isinstance(S, int) or S < 0:
        raise InputError(f"S: expected a non-negative int, got {S!r}")
    lengths = _check_lengths(cu_seqlens, None, x.shape[0], S)
    check_same_device(x=x, cu_seqlens=cu_seqlens)
    check_triton_device(x, cu_seqlens)
    return _UnpackTriton.apply(x, cu_seqlens, lengths, S)
