"""Triton lm_head: FP32 logits, forward and backward.

Forward: ``logits [T, V] fp32 = hidden [T, E] @ weight[V, E]^T``. One program owns one
``[BM, BN]`` tile of logits and accumulates the whole E axis in one FP32 register tile, in
``BK``-wide blocks in increasing order (``tl.dot`` through :func:`mma`: BF16 products are exact in
FP32), and stores the accumulator as FP32 — the logits are never rounded to BF16 (contract
``declared_exceptions.logits_for_scoring``). No split of E, no tree.

Backward (upstream ``dlogits`` is FP32): ``dhidden [T, E] = dlogits @ weight`` (reduces V) and
``dweight [V, E] = dlogits^T @ hidden`` (reduces T), both with FP32 operands (the BF16 operand is
upcast in registers) and ``input_precision="ieee"`` FP32 dots, FP32 accumulation in increasing
order, one rounding to BF16 at the store. Each output element is owned by one program: no atomics.

Configurations, fixed for every V and E (never derived from the problem size; the forward's tile
depends on whether T is decode-sized):

* forward (BF16 operands): ``BM = 128``, ``BN = 256``, ``BK = 64``, ``num_warps = 8``,
  ``num_stages = 3`` (H200, T = 1027, V = 151936: 0.74x cuBLAS's BF16-output GEMM; T = 1: 0.62x);
* forward at T <= 16 (decode): ``BM = 16``, ``BN = 128``, the same ``BK``, ``num_warps = 8``,
  ``num_stages = 4`` (:data:`DEC_BM`: which program computes a logit, not how);
* backward (FP32 operands, FMA dots): ``BM = BN = 64``, ``BK = 16``, ``num_warps = 4``,
  ``num_stages = 4`` (H200: dhidden 45 ms, dweight 38 ms at T = 1027, about 30 TFLOP/s; 128 x 128
  tiles ran 5x slower);

both with grouped program order ``GROUP_M = 8`` (which program computes a tile, not how). FMA dots
sum each BK block in increasing k, so the backward bits do not depend on the tile shape either.

Batch invariance: logit ``(t, v)`` depends only on row t of hidden and row v of weight, computed
with instructions that do not depend on T or on the tile's other rows; so does row t of dhidden.
dweight sums over tokens and is compared only under the layout transform.

Layout: ``hidden`` needs a unit stride on E (row stride free); ``weight`` may have any strides
(e.g. a transposed view of an ``[E, V]`` buffer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, mma, upcast_dots

GROUP_M = 8
FWD_BM, FWD_BN, FWD_BK, FWD_WARPS, FWD_STAGES = 128, 256, 64, 8, 3
BWD_BM, BWD_BN, BWD_BK, BWD_WARPS, BWD_STAGES = 64, 64, 16, 4, 4
DECODE_M = 16
DEC_BM, DEC_BN, DEC_WARPS, DEC_STAGES = 16, 128, 8, 4
"""Forward tiles for T <= ``DECODE_M`` (a decode step's logits): 16-row tiles stream the weight
(1.2 GB at Qwen3-8B) instead of paying for 128 rows of MMA work per program; the same BK blocks in
the same order, so the same bits (tested: a row alone equals the row in a batch of 33, and on the
H200 at the Qwen3-8B vocabulary, ``tests/ops/test_lm_head.py``). The det_gemm decode tiles' shape."""


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                 s_am, s_ak, s_bk, s_bn, s_cm, s_cn, a_step, b_step,
                 FP32_OPERANDS: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                 UPCAST: tl.constexpr):
    """c [M, N] = a [M, K] @ b [K, N]: one FP32 accumulator over all of K in increasing BK blocks,
    stored in c's dtype (FP32 logits, or BF16 gradients rounded once)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    # Rows/columns past the edge load a valid (wrapped) row/column instead of being masked; their
    # results are never stored, and no output element reads another row or column.
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + (rows % M).to(tl.int64)[:, None] * s_am + rk.to(tl.int64)[None, :] * s_ak
    b_ptrs = b_ptr + (cols % N).to(tl.int64)[None, :] * s_bn + rk.to(tl.int64)[:, None] * s_bk
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = rk < K - k0
        a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if FP32_OPERANDS:
            acc = mma(a.to(tl.float32), b.to(tl.float32), acc, UPCAST)
        else:
            acc = mma(a, b, acc, UPCAST)
        a_ptrs += a_step
        b_ptrs += b_step
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * s_cm + cols.to(tl.int64)[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])


def _gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, fp32_operands: bool) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if fp32_operands:
        bm, bn, bk, warps, stages = BWD_BM, BWD_BN, BWD_BK, BWD_WARPS, BWD_STAGES
    elif m <= DECODE_M:
        bm, bn, bk, warps, stages = DEC_BM, DEC_BN, FWD_BK, DEC_WARPS, DEC_STAGES
    else:
        bm, bn, bk, warps, stages = FWD_BM, FWD_BN, FWD_BK, FWD_WARPS, FWD_STAGES
    grid = (cdiv(m, bm) * cdiv(n, bn),)
    _gemm_kernel[grid](
        a, b, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        bk * a.stride(1), bk * b.stride(0),
        FP32_OPERANDS=fp32_operands, BM=bm, BN=bn, BK=bk, GROUP_M=GROUP_M, UPCAST=upcast_dots(),
        num_warps=warps, num_stages=stages,
        enable_fp_fusion=FP_FUSION,
    )
    return c


def lm_head_fwd(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """logits [T, V] fp32 = hidden [T, E] bf16 @ weight [V, E]ᵀ (validated inputs)."""
    return _gemm(hidden, weight.t(), torch.float32, False)


def lm_head_bwd(hidden: torch.Tensor, weight: torch.Tensor, dlogits: torch.Tensor, need_dh: bool,
                need_dw: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dhidden [T, E], dweight [V, E]) bf16 from FP32 dlogits [T, V]; each only when needed."""
    dhidden = _gemm(dlogits, weight, torch.bfloat16, True) if need_dh else None
    dweight = _gemm(dlogits.t(), hidden, torch.bfloat16, True) if need_dw else None
    return dhidden, dweight
