"""pack / unpack, the op's one path: input checks (the host plan of cu_seqlens), the torch ops
``rl_engine::pack`` and ``rl_engine::unpack`` (fake shapes registered; each one's autograd is the
other), the per-backend entry points the op spec lists, and the public :func:`pack` and
:func:`unpack`. Kernels and launchers: ``triton.py``, ``cuda.py``.

The sequence lengths are host values (they size the output), read once from ``cu_seqlens`` when
the call is validated and handed to the torch ops as ``int[]``: the ops themselves never read
device values.
"""

from __future__ import annotations

import torch

from rl_engine.errors import BackendUnavailable, InputError
from rl_engine.ops._torch_op import call, check_device, grad_bf16, launchers, register_autograd, run
from rl_engine.ops._validate import check_cu_seqlens, check_same_device, check_tensor


def check_lengths(cu_seqlens: torch.Tensor, n_seqs: int | None, total: int | None, seq_len: int) -> list[int]:
    """Validate cu_seqlens (int32 [B+1], B = ``n_seqs`` when given, starting at 0, non-decreasing,
    ending at ``total`` when given) and every length <= ``seq_len``; return the lengths (host
    values: this reads cu_seqlens once). Raises InputError."""
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


def _pack_op(x: torch.Tensor, cu: torch.Tensor, lengths: list[int], backend: str) -> torch.Tensor:
    """[sum(lengths), E] bf16 from validated x [B, S, E]."""
    return launchers("pack", backend).pack_rows(x, cu, lengths)


pack_op = torch.library.custom_op("rl_engine::pack", _pack_op, mutates_args=())


@pack_op.register_fake
def _(x, cu, lengths, backend):
    return x.new_empty((sum(lengths), x.shape[2]), dtype=torch.bfloat16)


def _unpack_op(x: torch.Tensor, cu: torch.Tensor, lengths: list[int], seq_len: int, backend: str) -> torch.Tensor:
    """[len(lengths), seq_len, E] bf16 from validated packed x [T, E] (zeros in the padding)."""
    return launchers("pack", backend).unpack_rows(x, cu, len(lengths), seq_len)


unpack_op = torch.library.custom_op("rl_engine::unpack", _unpack_op, mutates_args=())


@unpack_op.register_fake
def _(x, cu, lengths, seq_len, backend):
    return x.new_empty((len(lengths), seq_len, x.shape[1]), dtype=torch.bfloat16)


def _setup_pack(ctx, inputs, output):
    x, cu, lengths, backend = inputs
    ctx.save_for_backward(cu)
    ctx.lengths, ctx.seq_len, ctx.backend = lengths, x.shape[1], backend


def _backward_pack(ctx, dy):
    (cu,) = ctx.saved_tensors
    return call(unpack_op, grad_bf16(dy), cu, ctx.lengths, ctx.seq_len, ctx.backend), None, None, None


def _setup_unpack(ctx, inputs, output):
    _x, cu, lengths, _seq_len, backend = inputs
    ctx.save_for_backward(cu)
    ctx.lengths, ctx.backend = lengths, backend


def _backward_unpack(ctx, dy):
    (cu,) = ctx.saved_tensors
    return call(pack_op, grad_bf16(dy), cu, ctx.lengths, ctx.backend), None, None, None, None


register_autograd(pack_op, _pack_op, _backward_pack, _setup_pack)
register_autograd(unpack_op, _unpack_op, _backward_unpack, _setup_unpack)


def pack_kernel(x: torch.Tensor, cu_seqlens: torch.Tensor, *, backend: str) -> torch.Tensor:
    """Padded -> packed on a kernel backend. x: [B, S, E] bfloat16, cu_seqlens: [B+1] int32 ->
    [T, E] bfloat16.

    Exact row copies (no arithmetic). Backward: dx [B, S, E] bfloat16 = unpack(dy), zeros in the
    padding. Any strides on B and S are accepted; E needs unit stride.

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on E; cu_seqlens is not int32 [B+1],
        starting at 0 and non-decreasing; a sequence is longer than S; devices differ.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=3, contiguous_last=True)
    lengths = check_lengths(cu_seqlens, x.shape[0], None, x.shape[1])
    check_same_device(x=x, cu_seqlens=cu_seqlens)
    check_device(backend, x, cu_seqlens)
    return run(pack_op, _pack_op, x, cu_seqlens.contiguous(), lengths, backend)


def unpack_kernel(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int, *, backend: str) -> torch.Tensor:
    """Packed -> padded on a kernel backend. x: [T, E] bfloat16, cu_seqlens: [B+1] int32, S ->
    [B, S, E] bfloat16.

    Exact row copies, exact zeros in the padding. Backward: dx [T, E] bfloat16 = pack(dy).

    Raises
    ------
    InputError
        x is not a 2-D bfloat16 tensor with unit stride on E; cu_seqlens is not int32 [B+1],
        starting at 0, non-decreasing and ending at T; S is not a non-negative int or a sequence is
        longer than S; devices differ.
    BackendUnavailable
        As :func:`pack_kernel`.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if isinstance(S, bool) or not isinstance(S, int) or S < 0:
        raise InputError(f"S: expected a non-negative int, got {S!r}")
    lengths = check_lengths(cu_seqlens, None, x.shape[0], S)
    check_same_device(x=x, cu_seqlens=cu_seqlens)
    check_device(backend, x, cu_seqlens)
    return run(unpack_op, _unpack_op, x, cu_seqlens.contiguous(), lengths, S, backend)


def pack_triton(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """:func:`pack_kernel` on ``triton_cuda_bf16``."""
    return pack_kernel(x, cu_seqlens, backend="triton_cuda_bf16")


def pack_cuda(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """:func:`pack_kernel` on ``cuda_bf16``."""
    return pack_kernel(x, cu_seqlens, backend="cuda_bf16")


def unpack_triton(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int) -> torch.Tensor:
    """:func:`unpack_kernel` on ``triton_cuda_bf16``."""
    return unpack_kernel(x, cu_seqlens, S, backend="triton_cuda_bf16")


def unpack_cuda(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int) -> torch.Tensor:
    """:func:`unpack_kernel` on ``cuda_bf16``."""
    return unpack_kernel(x, cu_seqlens, S, backend="cuda_bf16")
