"""Triton causal varlen GQA attention (forward + deterministic backward) and KV-cache decode.

Design
------
Forward (FlashAttention-2 style, Dao 2023). One program owns one block of ``BLOCK_M`` query rows
(of one head, prefill) or the query heads of one KV-head group (decode) and walks the keys of its
sequence in blocks of the fixed size ``BLOCK_N``, always from key 0 in increasing order. Per block:
scores ``s = mma(q, kᵀ)`` (BF16 operands, FP32 accumulation) times ``scale`` in FP32, keys past a
row's causal limit set to ``-inf``, online softmax in FP32 (running max ``m``, running sum ``l`` of
the FP32 probabilities, FP32 accumulator ``acc``), ``P`` rounded to BF16 for ``acc += mma(P, V)``
(the FlashAttention choice: the row sum ``l`` uses the unrounded FP32 ``P``). At the end
``out = acc / l`` (IEEE division, ``div_rn``) is rounded to BF16 once, and ``lse = m + log(l)``
(FP32) is kept for the backward.

Path independence (pitfall P8). The bits of one query row depend only on its own scores: the KV
blocks are the same absolute blocks ``[j*BLOCK_N, (j+1)*BLOCK_N)`` of its sequence whatever the
call (full prefill, a chunk of queries with ``Lq < Lk``, an ``Lq = 1`` step, or
:func:`attention_decode_triton`), and they are visited in the same order. A query block stops at
the KV block holding the causal limit of its *last* row, so earlier rows of the block may see
extra blocks that are entirely masked for them; such a block leaves the row's state bitwise
unchanged: its row max is ``-inf`` so ``m`` is unchanged, the rescale factor is forced to exactly
1 (``alpha = 1`` when ``m_new == m``, never ``exp(-inf - -inf)``), every ``p`` is
``exp(-inf) = 0`` so ``l`` and ``acc`` get exact zeros added. Rows that never see a key keep
``l = 0`` and are written as exact zeros (pitfall P10). Keys past the sequence's end (or past
``cache_seqlens``) are never loaded (masked loads), so junk there cannot leak in.
Decode packs the ``H / Hkv`` query heads that share one KV head into the rows of one program;
per-row math is the same code as prefill (``_kv_loop``), with the same ``BLOCK_N``, warps, stages
and the same 64-row tile (``BLOCK_M_DECODE = BLOCK_M``): on the H200 a 16- or 32-row tile is
compiled to ``mma.sync`` rather than ``wgmma`` and changed the last bit of about 2 % of the rows,
while 64- and 128-row tiles gave identical bits (seen on the H200 with triton 3.6: every query of
a 2817-token sequence as a decode step equal to its prefill row). All launch constants are module
constants: nothing depends on T, the batch or a sequence length, and there is no split-KV (so a
decode with few sequences runs only ``B * Hkv`` programs and is far from copy bandwidth).

Backward (FlashAttention-2, deterministic, no atomics). ``delta = rowsum(dO * O)`` in FP32; ``P`` is
recomputed from the saved FP32 ``lse``. A dK/dV kernel owns one KV block of one KV head of one
sequence and loops, in a fixed order, over the query heads of its group and, for each head, over
the query blocks that can see the block; ``dV += Pᵀ dO``, ``dS = P * (dP - delta)``,
``dK += dSᵀ Q`` (``P`` and ``dS`` rounded to BF16 as MMA operands, FP32 accumulators). A separate
dQ kernel owns one query block of one head and loops over the KV blocks from key 0:
``dQ += dS K``. ``scale`` multiplies dK and dQ once at the end; each gradient is rounded to BF16
once.

Under the Triton CPU interpreter (``TRITON_INTERPRET=1``) ``mma`` upcasts BF16 operands to FP32 and
NumPy does the product; the FP32 products are exact, only the summation order may differ from the
GPU's tensor cores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import check_triton_device, mma, upcast_dots
from rl_engine.ops.attention._checks import VarlenPlan, check_decode, check_varlen

BLOCK_M = 64
"""Query rows per program in the varlen forward and in the dQ kernel."""
BLOCK_N = 64
"""Keys per KV block, in every path (forward, decode, backward). Never depends on the problem size."""
BLOCK_M_DECODE = BLOCK_M
"""Rows (query heads of one KV group) per decode program. Equal to ``BLOCK_M`` on purpose: on the
H200 (triton 3.6) a 16- or 32-row tile is compiled to ``mma.sync`` instead of ``wgmma`` and its
rows differed from the 64-row prefill tile's in the last bit for about 2 % of the rows, while 64
and 128 rows gave identical bits. The unused rows of a decode tile cost compute, not bandwidth."""
BLOCK_M_BWD = 64
"""Query rows per inner step of the dK/dV kernel."""
BLOCK_N_BWD = 64
"""Keys per dK/dV program (and per inner step of the dQ kernel)."""
BLOCK_T_DELTA = 64
"""Rows per program of the ``delta = rowsum(dO * O)`` kernel."""
NUM_WARPS = 4
NUM_STAGES = 2


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _kv_loop(acc, l_i, m_i, q, limit, k_base, v_base, stride_kn, stride_vn, kv_len, n_stop, scale,
             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax over KV blocks ``[0, n_stop)`` in increasing order (rows see keys <= limit)."""
    offs_d = tl.arange(0, D)
    offs_j = tl.arange(0, BLOCK_N)
    for start_n in range(0, n_stop, BLOCK_N):
        offs_n = start_n + offs_j
        in_kv = offs_n < kv_len
        kt = tl.load(k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                     mask=in_kv[None, :], other=0.0)  # [D, BLOCK_N]
        s = mma(q, kt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
        s = s * scale
        s = tl.where(offs_n[None, :] <= limit[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.where(m_new == m_i, 1.0, tl.exp(m_i - m_ref))
        p = tl.exp(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_d[None, :],
                    mask=in_kv[:, None], other=0.0)  # [BLOCK_N, D]
        acc = mma(p.to(tl.bfloat16), v, acc * alpha[:, None], UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, n_mblocks,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_ot, stride_oh, stride_lh, scale,
                     GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    b = pid // n_mblocks
    m0 = (pid % n_mblocks) * BLOCK_M
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if m0 < q_len:
        k_start = tl.load(cu_k_ptr + b)
        k_len = tl.load(cu_k_ptr + b + 1) - k_start
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        row_ok = offs_m < q_len
        limit = tl.where(row_ok, k_len - q_len + offs_m, -1)
        rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        kvh = h // GROUP
        k_base = k_ptr + k_start.to(tl.int64) * stride_kt + kvh * stride_kh
        v_base = v_ptr + k_start.to(tl.int64) * stride_vt + kvh * stride_vh
        n_stop = tl.minimum(k_len - q_len + m0 + BLOCK_M, k_len)
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, limit, k_base, v_base, stride_kt, stride_vt, k_len,
                                 n_stop, scale, D, BLOCK_M, BLOCK_N, UPCAST)
        has = l_i > 0.0
        out = tl.math.div_rn(acc, tl.where(has, l_i, 1.0)[:, None])
        tl.store(o_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(tl.bfloat16),
                 mask=row_ok[:, None])
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), 0.0)
        tl.store(lse_ptr + h * stride_lh + rows, lse, mask=row_ok)


@triton.jit
def _attn_decode_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, seqlens_ptr,
                        stride_qb, stride_qh, stride_kb, stride_kt, stride_kh,
                        stride_vb, stride_vt, stride_vh, stride_ob, stride_oh, scale,
                        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        UPCAST: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    g0 = tl.program_id(2) * BLOCK_M
    n = tl.load(seqlens_ptr + b)
    offs_g = g0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    limit = tl.where(row_ok, n - 1, -1)
    k_base = kc_ptr + b * stride_kb + kvh * stride_kh
    v_base = vc_ptr + b * stride_vb + kvh * stride_vh
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, limit, k_base, v_base, stride_kt, stride_vt, n, n, scale,
                             D, BLOCK_M, BLOCK_N, UPCAST)
    out = tl.math.div_rn(acc, tl.where(l_i > 0.0, l_i, 1.0)[:, None])
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(tl.bfloat16),
             mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _attn_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, T, stride_ot, stride_oh, stride_dot, stride_doh, stride_dh,
                           D: tl.constexpr, BLOCK_T: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    offs_d = tl.arange(0, D)
    ok = rows < T
    r64 = rows.to(tl.int64)
    o = tl.load(o_ptr + r64[:, None] * stride_ot + h * stride_oh + offs_d[None, :], mask=ok[:, None], other=0.0)
    do = tl.load(do_ptr + r64[:, None] * stride_dot + h * stride_doh + offs_d[None, :], mask=ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + h * stride_dh + r64, delta, mask=ok)


@triton.jit
def _attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_q_ptr, cu_k_ptr,
                          n_nblocks, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                          stride_dot, stride_doh, stride_lh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                          scale, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    b = pid // n_nblocks
    n0 = (pid % n_nblocks) * BLOCK_N
    k_start = tl.load(cu_k_ptr + b)
    k_len = tl.load(cu_k_ptr + b + 1) - k_start
    if n0 < k_len:
        q_start = tl.load(cu_q_ptr + b)
        q_len = tl.load(cu_q_ptr + b + 1) - q_start
        offset = k_len - q_len  # position of query 0
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        n_ok = offs_n < k_len
        krows = (k_start + offs_n).to(tl.int64)
        k = tl.load(k_ptr + krows[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)
        v = tl.load(v_ptr + krows[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)
        dk = tl.zeros((BLOCK_N, D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, D), dtype=tl.float32)
        # First query that sees key n0 is i = n0 - offset; start at the (sequence-aligned) block holding it.
        m_begin = (tl.maximum(n0 - offset, 0) // BLOCK_M) * BLOCK_M
        for g in range(GROUP):
            h = kvh * GROUP + g
            for m0 in range(m_begin, q_len, BLOCK_M):
                offs_m = m0 + tl.arange(0, BLOCK_M)
                m_ok = offs_m < q_len
                qrows = (q_start + offs_m).to(tl.int64)
                q = tl.load(q_ptr + qrows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                            mask=m_ok[:, None], other=0.0)
                do = tl.load(do_ptr + qrows[:, None] * stride_dot + h * stride_doh + offs_d[None, :],
                             mask=m_ok[:, None], other=0.0)
                lse = tl.load(lse_ptr + h * stride_lh + qrows, mask=m_ok, other=0.0)
                delta = tl.load(delta_ptr + h * stride_lh + qrows, mask=m_ok, other=0.0)
                st = mma(k, tl.trans(q), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), UPCAST) * scale
                visible = (offs_n[:, None] <= (offset + offs_m)[None, :]) & m_ok[None, :] & n_ok[:, None]
                pt = tl.where(visible, tl.exp(st - lse[None, :]), 0.0)
                dv = mma(pt.to(tl.bfloat16), do, dv, UPCAST)
                dpt = mma(v, tl.trans(do), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), UPCAST)
                dst = pt * (dpt - delta[None, :])
                dk = mma(dst.to(tl.bfloat16), q, dk, UPCAST)
        dk = dk * scale
        tl.store(dk_ptr + krows[:, None] * stride_dkt + kvh * stride_dkh + offs_d[None, :], dk.to(tl.bfloat16),
                 mask=n_ok[:, None])
        tl.store(dv_ptr + krows[:, None] * stride_dvt + kvh * stride_dvh + offs_d[None, :], dv.to(tl.bfloat16),
                 mask=n_ok[:, None])


@triton.jit
def _attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q_ptr, cu_k_ptr, n_mblocks,
                        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                        stride_dot, stride_doh, stride_lh, stride_dqt, stride_dqh, scale,
                        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    b = pid // n_mblocks
    m0 = (pid % n_mblocks) * BLOCK_M
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if m0 < q_len:
        k_start = tl.load(cu_k_ptr + b)
        k_len = tl.load(cu_k_ptr + b + 1) - k_start
        offset = k_len - q_len
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        offs_j = tl.arange(0, BLOCK_N)
        m_ok = offs_m < q_len
        limit = tl.where(m_ok, offset + offs_m, -1)
        qrows = (q_start + offs_m).to(tl.int64)
        q = tl.load(q_ptr + qrows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                    mask=m_ok[:, None], other=0.0)
        do = tl.load(do_ptr + qrows[:, None] * stride_dot + h * stride_doh + offs_d[None, :],
                     mask=m_ok[:, None], other=0.0)
        lse = tl.load(lse_ptr + h * stride_lh + qrows, mask=m_ok, other=0.0)
        delta = tl.load(delta_ptr + h * stride_lh + qrows, mask=m_ok, other=0.0)
        kvh = h // GROUP
        k_base = k_ptr + k_start.to(tl.int64) * stride_kt + kvh * stride_kh
        v_base = v_ptr + k_start.to(tl.int64) * stride_vt + kvh * stride_vh
        n_stop = tl.minimum(offset + m0 + BLOCK_M, k_len)
        dq = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        for start_n in range(0, n_stop, BLOCK_N):
            offs_n = start_n + offs_j
            in_kv = offs_n < k_len
            k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kt + offs_d[None, :],
                        mask=in_kv[:, None], other=0.0)  # [BLOCK_N, D]
            v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vt + offs_d[None, :],
                        mask=in_kv[:, None], other=0.0)
            s = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST) * scale
            visible = offs_n[None, :] <= limit[:, None]
            p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
            dp = mma(do, tl.trans(v), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
            ds = p * (dp - delta[:, None])
            dq = mma(ds.to(tl.bfloat16), k, dq, UPCAST)
        dq = dq * scale
        tl.store(dq_ptr + qrows[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :], dq.to(tl.bfloat16),
                 mask=m_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def _forward(q, k, v, cu_q, cu_k, scale: float, plan: VarlenPlan, *, block_m: int = BLOCK_M,
             block_n: int = BLOCK_N, num_warps: int = NUM_WARPS,
             num_stages: int = NUM_STAGES) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the varlen forward; returns (out [Tq, H, D] bf16, lse [H, Tq] fp32).

    The keyword arguments are parameters only so tests, the negative control and benchmarks can
    vary them; the public path always uses the module constants.
    """
    tq, h, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((tq, h, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    if tq == 0 or plan.batch == 0:
        return out, lse
    n_mblocks = triton.cdiv(plan.max_lq, block_m)
    grid = (plan.batch * n_mblocks, h)
    _attn_fwd_kernel[grid](
        q, k, v, out, lse, cu_q, cu_k, n_mblocks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), float(scale),
        GROUP=h // hkv, D=d, BLOCK_M=block_m, BLOCK_N=block_n, UPCAST=upcast_dots(),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out, lse


def _decode(q, k_cache, v_cache, cache_seqlens, scale: float, *, block_m: int = BLOCK_M_DECODE,
            block_n: int = BLOCK_N, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES) -> torch.Tensor:
    bsz, h, d = q.shape
    hkv = k_cache.shape[2]
    group = h // hkv
    out = torch.empty((bsz, h, d), dtype=torch.bfloat16, device=q.device)
    if bsz == 0:
        return out
    grid = (bsz, hkv, triton.cdiv(group, block_m))
    _attn_decode_kernel[grid](
        q, k_cache, v_cache, out, cache_seqlens,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), float(scale),
        GROUP=group, D=d, BLOCK_M=block_m, BLOCK_N=block_n, UPCAST=upcast_dots(),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def _backward(q, k, v, out, lse, do, cu_q, cu_k, scale: float, plan: VarlenPlan):
    tq, h, d = q.shape
    tk, hkv, _ = k.shape
    group = h // hkv
    # Every row is written by a kernel (every token belongs to a sequence), so no zero fill.
    dq = torch.empty((tq, h, d), dtype=torch.bfloat16, device=q.device)
    dk = torch.empty((tk, hkv, d), dtype=torch.bfloat16, device=q.device)
    dv = torch.empty((tk, hkv, d), dtype=torch.bfloat16, device=q.device)
    if tk == 0 or plan.batch == 0:
        return dq, dk, dv
    up = upcast_dots()
    delta = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    if tq:
        _attn_bwd_delta_kernel[(triton.cdiv(tq, BLOCK_T_DELTA), h)](
            out, do, delta, tq, out.stride(0), out.stride(1), do.stride(0), do.stride(1), delta.stride(0),
            D=d, BLOCK_T=BLOCK_T_DELTA, num_warps=NUM_WARPS,
        )
    n_nblocks = triton.cdiv(plan.max_lk, BLOCK_N_BWD)
    _attn_bwd_dkdv_kernel[(plan.batch * n_nblocks, hkv)](
        q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, n_nblocks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), lse.stride(0), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        float(scale), GROUP=group, D=d, BLOCK_M=BLOCK_M_BWD, BLOCK_N=BLOCK_N_BWD, UPCAST=up,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    if tq:
        n_mblocks = triton.cdiv(plan.max_lq, BLOCK_M)
        _attn_bwd_dq_kernel[(plan.batch * n_mblocks, h)](
            q, k, v, do, lse, delta, dq, cu_q, cu_k, n_mblocks,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), lse.stride(0), dq.stride(0), dq.stride(1), float(scale),
            GROUP=group, D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N_BWD, UPCAST=up,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        )
    return dq, dk, dv


class _AttentionTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, scale, plan, block_n):
        out, lse = _forward(q, k, v, cu_q, cu_k, scale, plan, block_n=block_n)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.scale = scale
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        do = do.to(torch.bfloat16)
        if do.shape[-1] > 1 and do.stride(-1) != 1:
            do = do.contiguous()
        dq, dk, dv = _backward(q, k, v, out, lse, do, cu_q, cu_k, ctx.scale, ctx.plan)
        return dq, dk, dv, None, None, None, None, None


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, *, block_n: int) -> torch.Tensor:
    plan = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=torch.bfloat16, kernel=True)
    check_triton_device(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return _AttentionTriton.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, float(scale), plan, block_n)


def attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen GQA attention with Triton kernels (forward and backward).

    q [Tq, H, D], k/v [Tk, Hkv, D] bfloat16 with unit stride on D (token / head strides free, so
    views of a fused qkv buffer work); cu_seqlens_q / cu_seqlens_k int32 [B+1] on the same device
    -> [Tq, H, D] bfloat16. Query ``i`` of sequence ``b`` sits at position ``Lk - Lq + i`` and sees
    keys ``0 .. Lk - Lq + i``; query head ``h`` uses KV head ``h // (H / Hkv)``. FP32 scores,
    softmax and accumulation, one rounding to BF16 (see the module's Design notes). Backward:
    dq [Tq, H, D], dk / dv [Tk, Hkv, D] bfloat16, deterministic (no atomics).
    Math: Vaswani et al. 2017; online softmax and backward of FlashAttention-2 (Dao 2023).

    Raises
    ------
    InputError
        Wrong dtype, shape or device, non-unit stride on D, D not a power of two >= 16,
        ``H % Hkv != 0``, malformed cu_seqlens, or ``Lq > Lk`` for a sequence.
    BackendUnavailable
        Tensors not on a CUDA device (and the Triton interpreter is off).
    """
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, block_n=BLOCK_N)


def attention_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One decode step against a static KV cache (inference only, no gradient).

    q [B, H, D], k_cache / v_cache [B, S_max, Hkv, D] bfloat16 (unit stride on D, other strides
    free), cache_seqlens int32 [B] in [0, S_max] -> [B, H, D] bfloat16. Query ``b`` sees cache
    slots ``0 .. cache_seqlens[b] - 1`` (the caller has written the current token's k/v at slot
    ``cache_seqlens[b] - 1``); slots past it are never read. ``cache_seqlens[b] == 0`` gives 0.
    Bitwise equal to the same query's row of :func:`attention_triton` in a full prefill (same
    ``BLOCK_N``, same KV block order, same per-row code).

    Raises
    ------
    InputError
        Wrong dtype, shape or device, non-unit stride on D, D not a power of two >= 16,
        ``H % Hkv != 0``, cache_seqlens outside [0, S_max], or inputs that require grad while
        grad mode is on (decode is inference only).
    BackendUnavailable
        Tensors not on a CUDA device (and the Triton interpreter is off).
    """
    check_decode(q, k_cache, v_cache, cache_seqlens, scale, dtype=torch.bfloat16, kernel=True)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        raise InputError("attention_decode is inference only: call it under torch.no_grad() or on tensors "
                         "that do not require grad")
    check_triton_device(q, k_cache, v_cache, cache_seqlens)
    return _decode(q, k_cache, v_cache, cache_seqlens, float(scale))


def attention_triton_size_dependent_kv_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """NEGATIVE CONTROL, never a backend: the KV block size depends on the sequence lengths.

    ``BLOCK_N = 16`` when every sequence has at most 16 queries (decode steps, small chunks),
    else the normal ``BLOCK_N``: a "smaller tiles for short calls" heuristic. A decode step then
    splits the keys into other blocks than the prefill, so the online softmax rescales at other
    points and the bits change; the ``chunk`` invariance check must catch it.
    """
    plan = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=torch.bfloat16, kernel=True)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, block_n=16 if plan.max_lq <= 16 else BLOCK_N)
