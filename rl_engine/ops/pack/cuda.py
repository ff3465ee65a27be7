"""CUDA C++ pack / unpack (``cuda_bf16`` backend), forward and backward (each is the other's backward).

Kernels ``rl_pack`` / ``rl_unpack`` in ``rl_engine/backends/cuda_src/elementwise.cu``. pack: one
block per (packed row t, 1024 columns) reads ``b = seq_of_row[t]`` (built on the host from
``cu_seqlens``), ``s = t - cu_seqlens[b]`` and copies the BF16 bits of ``x[b, s]``. unpack: one
block per (padded row ``b*S + s``, column block) copies packed row ``cu_seqlens[b] + s`` when
``s < L_b`` and writes exact zeros otherwise. No arithmetic: every output row is an exact copy.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch, unit_last
from rl_engine.errors import InputError
from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.pack.triton import _check_lengths


def _launch_pack(x: torch.Tensor, cu: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    e = x.shape[2]
    total = sum(lengths)
    y = torch.empty((total, e), dtype=torch.bfloat16, device=x.device)
    if total and e:
        seq = torch.repeat_interleave(
            torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths, dtype=torch.int64)
        ).to(x.device)
        launch(x.device, "rl_pack", x, cu, seq, y, total, e, x.stride(0), x.stride(1), y.stride(0))
    return y


def _launch_unpack(x: torch.Tensor, cu: torch.Tensor, n_seqs: int, seq_len: int) -> torch.Tensor:
    e = x.shape[1]
    y = torch.empty((n_seqs, seq_len, e), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_unpack", x, cu, y, n_seqs, seq_len, e, x.stride(0), y.stride(0), y.stride(1))
    return y


class _PackCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cu, lengths):
        ctx.save_for_backward(cu)
        ctx.seq_len = x.shape[1]
        ctx.n_seqs = x.shape[0]
        return _launch_pack(x, cu, lengths)

    @staticmethod
    def backward(ctx, dy):
        (cu,) = ctx.saved_tensors
        return _launch_unpack(unit_last(dy.to(torch.bfloat16)), cu, ctx.n_seqs, ctx.seq_len), None, None


class _UnpackCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cu, lengths, seq_len):
        ctx.save_for_backward(cu)
        ctx.lengths = lengths
        return _launch_unpack(x, cu, len(lengths), seq_len)

    @staticmethod
    def backward(ctx, dy):
        (cu,) = ctx.saved_tensors
        return _launch_pack(unit_last(dy.to(torch.bfloat16)), cu, ctx.lengths), None, None, None


def pack_cuda(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Padded -> packed with CUDA C++. x: [B, S, E] bfloat16, cu_seqlens: [B+1] int32 -> [T, E] bfloat16.

    Exact row copies (no arithmetic). Backward: dx [B, S, E] bfloat16 = unpack(dy), zeros in the
    padding. Any strides on B and S are accepted; E needs unit stride.

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on E; cu_seqlens is not int32 [B+1],
        starting at 0 and non-decreasing; a sequence is longer than S; devices differ.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=3, contiguous_last=True)
    lengths = _check_lengths(cu_seqlens, x.shape[0], None, x.shape[1])
    check_same_device(x=x, cu_seqlens=cu_seqlens)
    check_cuda_device(x, cu_seqlens)
    return _PackCuda.apply(x, cu_seqlens.contiguous(), lengths)


def unpack_cuda(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int) -> torch.Tensor:
    """Packed -> padded with CUDA C++. x: [T, E] bfloat16, cu_seqlens: [B+1] int32, S -> [B, S, E] bfloat16.

    Exact row copies, exact zeros in the padding. Backward: dx [T, E] bfloat16 = pack(dy).

    Raises
    ------
    InputError
        x is not a 2-D bfloat16 tensor with unit stride on E; cu_seqlens is not int32 [B+1],
        starting at 0, non-decreasing and ending at T; S is not a non-negative int or a sequence is
        longer than S; devices differ.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if isinstance(S, bool) or not isinstance(S, int) or S < 0:
        raise InputError(f"S: expected a non-negative int, got {S!r}")
    lengths = _check_lengths(cu_seqlens, None, x.shape[0], S)
    check_same_device(x=x, cu_seqlens=cu_seqlens)
    check_cuda_device(x, cu_seqlens)
    return _UnpackCuda.apply(x, cu_seqlens.contiguous(), lengths, S)
