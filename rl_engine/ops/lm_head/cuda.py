"""CUDA C++ lm_head: FP32 logits (``cuda_bf16`` backend), forward and backward.

Forward (``rl_gemm_bf16_f32out`` in ``rl_engine/backends/cuda_src/gemm.cu``): ``logits [T, V] fp32 =
hidden [T, E] @ weight[V, E]^T``; one block per 128 x 128 logits tile, BF16 WMMA tensor-core tiles
with one FP32 accumulator over all of E in 32-wide steps in increasing order, stored as FP32 — the
logits are never rounded to BF16 (contract ``declared_exceptions.logits_for_scoring``, ``docs/pitfalls.md`` P5).

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

from rl_engine.backends.cuda_launch import launch
from rl_engine.ops.det_gemm.cuda import WARP_GEMV_ON_CUDA


def gemm_f32_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
                 warp_gemv: bool | None = None) -> torch.Tensor:
    """``a [M, K] @ b [K, N]`` (bf16, any strides) -> FP32 [M, N] (into ``out`` when given).
    ``warp_gemv``: the decode GEMV for M <= 16 (None: ``det_gemm.cuda.WARP_GEMV_ON_CUDA``)."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=torch.float32, device=a.device) if out is None else out
    launch(a.device, "rl_gemm_bf16_f32out", a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
           c.stride(0), c.stride(1), int(WARP_GEMV_ON_CUDA if warp_gemv is None else warp_gemv))
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


def lm_head_fwd(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """logits [T, V] fp32 = hidden [T, E] bf16 @ weight [V, E]ᵀ (validated inputs)."""
    return gemm_f32_out(hidden, weight.t())


def lm_head_bwd(hidden: torch.Tensor, weight: torch.Tensor, dlogits: torch.Tensor, need_dh: bool,
                need_dw: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dhidden [T, E], dweight [V, E]) bf16 from FP32 dlogits [T, V]; each only when needed."""
    dhidden = gemm_fp32_math(dlogits, weight, torch.bfloat16) if need_dh else None
    dweight = gemm_fp32_math(dlogits.t(), hidden, torch.bfloat16) if need_dw else None
    return dhidden, dweight
