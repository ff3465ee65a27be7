"""CUDA C++ lm_head: FP32 logits (``cuda_bf16`` backend), forward and backward.

Forward (``rl_gemm_bf16_f32out`` in ``rl_engine/backends/cuda_src/gemm.cu``): ``logits [T, V] fp32 =
hidden [T, E] @ weight[V, E]^T``; one block per 128 x 128 logits tile, BF16 WMMA tensor-core tiles
with one FP32 accumulator over all of E in 32-wide steps in increasing order, stored as FP32 — the
logits are never rounded to BF16 (contract ``declared_exceptions.logits_for_scoring``, pitfall P5).

Backward (``rl_gemm_f32_simt``, CUDA cores), upstream ``dlogits`` FP32: ``dhidden [T, E] = dlogits @
weight`` (reduces V) and ``dweight [V, E] = dlogits^T @ hidden`` (reduces T): FP32 operands (the
BF16 operand upcast exactly), one FP32 accumulator per output updated with FMA in increasing
order, rounded once to BF16. Each output element is owned by one thread: no atomics.

Batch invariance: logit ``(t, v)`` depends only on row t of hidden and row v of weight, computed
by an instruction sequence that does not depend on T or the tile's other rows; so does row t of
dhidden. dweight sums over tokens (compared only under the layout transform).
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch
from rl_engine.errors import InputError
from rl_engine.ops._validate import check_same_device, check_tensor


def gemm_f32_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a [M, K] @ b [K, N]`` (bf16, any strides) -> FP32 [M, N] (into ``out`` when given)."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=torch.float32, device=a.device) if out is None else out
    launch(a.device, "rl_gemm_bf16_f32out", a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
           c.stride(0), c.stride(1))
    return c


def gemm_fp32_math(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
                   out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """``a [M, K] @ b [K, N]`` on CUDA cores with FP32 math (one operand FP32, the other BF16).

    Returns a new [M, N] tensor of ``out_dtype``, or adds the finished FP32 product to ``out``
    (FP32) when ``accumulate``.
    """
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    launch(a.device, "rl_gemm_f32_simt", a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
           out.stride(0), out.stride(1), int(a.dtype == torch.float32), int(b.dtype == torch.float32),
           int(out.dtype == torch.float32), int(accumulate))
    return out


class _LmHeadCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight):
        ctx.save_for_backward(hidden, weight)
        return gemm_f32_out(hidden, weight.t())

    @staticmethod
    def backward(ctx, dlogits):
        hidden, weight = ctx.saved_tensors
        dlogits = dlogits.to(torch.float32)
        dhidden = gemm_fp32_math(dlogits, weight, torch.bfloat16) if ctx.needs_input_grad[0] else None
        dweight = gemm_fp32_math(dlogits.t(), hidden, torch.bfloat16) if ctx.needs_input_grad[1] else None
        return dhidden, dweight


def lm_head_cuda(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """FP32 logits with CUDA C++. hidden: [T, E] bfloat16 (unit stride on E), weight: [V, E]
    bfloat16 (any strides) -> logits [T, V] float32.

    FP32 accumulation over all of E in increasing order (tensor cores), FP32 output (contract
    ``logits_for_scoring``; pitfall P5). Backward with FP32 upstream dlogits [T, V]: dhidden [T, E]
    and dweight [V, E] bfloat16, FP32 math on CUDA cores, one rounding.

    Raises
    ------
    InputError
        hidden or weight is not a 2-D bfloat16 tensor, hidden has a non-unit stride on E, their E
        sizes differ, or they sit on different devices.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("hidden", hidden, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_tensor("weight", weight, dtype=torch.bfloat16, ndim=2)
    if hidden.shape[1] != weight.shape[1]:
        raise InputError(f"hidden is [T, E] = {list(hidden.shape)} but weight is [V, E] = {list(weight.shape)}: E differs")
    check_same_device(hidden=hidden, weight=weight)
    check_cuda_device(hidden, weight)
    return _LmHeadCuda.apply(hidden, weight)
