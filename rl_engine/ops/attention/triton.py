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

Path independence (``docs/pitfalls.md`` P8). The bits of one query row depend only on its own scores: the KV
blocks are the same absolute blocks ``[j*BLOCK_N, (j+1)*BLOCK_N)`` of its sequence whatever the
call (full prefill, a chunk of queries with ``Lq < Lk``, an ``Lq = 1`` step, or
:func:`attention_decode_fwd`), and they are visited in the same order. A query block stops at
the KV block holding the causal limit of its *last* row, so earlier rows of the block may see
extra blocks that are entirely masked for them; such a block leaves the row's state bitwise
unchanged: its row max is ``-inf`` so ``m`` is unchanged, the rescale factor is forced to exactly
1 (``alpha = 1`` when ``m_new == m``, never ``exp(-inf - -inf)``), every ``p`` is
``exp(-inf) = 0`` so ``l`` and ``acc`` get exact zeros added. Rows that never see a key keep
``l = 0`` and are written as exact zeros (``docs/pitfalls.md`` P10). Keys past the sequence's end (or past
``cache_seqlens``) are never loaded (masked loads), so junk there cannot leak in.
Masked means absent (issue #17, docs/declared-semantics.md). ``0 * NaN = NaN``, so a masked
probability of exactly 0 is not enough when the value at a masked key is NaN / inf. Each loop is
split: the blocks every real row of the tile sees whole run the plain step (no extra cost); the
blocks that hold masked entries (the causal diagonal, keys past a length, and in the dK/dV kernel
the query blocks on the diagonal) select masked ``P`` / ``dS`` to exactly 0 and run their MMA
through ``_absent_mma``: the other operand (``V``, ``K``, ``Q`` or ``dO``) with non-finite values
replaced by 0 (the identity on finite values, so finite inputs give the old bits) and an exact 0/1
count product that turns the outputs a *visible* non-finite value reaches into NaN. A visible
score of -inf becomes NaN, and a row whose sum ``l`` is NaN is written as NaN (not as the no-key 0).
Decode packs the ``H / Hkv`` query heads that share one KV head into the rows of one program;
per-row math is the same code as prefill (``_kv_loop``), with the same ``BLOCK_N`` and the same
64-row tile (``BLOCK_M_DECODE = BLOCK_M``): on the H200 a 16- or 32-row tile is compiled to
``mma.sync`` rather than ``wgmma`` and changed the last bit of about 2 % of the rows, while 64- and
128-row tiles gave identical bits (seen on the H200 with triton 3.6: every query of a 2817-token
sequence as a decode step equal to its prefill row). Nothing depends on T or a sequence length,
and there is no split of the KV axis. A decode launch with few sequences may split the head dim
of ``P @ V`` over programs (each recomputes the full-D scores) and keep 3 KV blocks in flight
(:func:`decode_launch`, chosen from B and the head shapes): on the H200 both gave the unsplit
bits in every configuration swept. Each program still walks every KV block in turn, so a batch
of one sequence stays latency-bound (16 us per layer at context 1024).

Backward (FlashAttention-2, deterministic, no atomics). ``delta = rowsum(dO * O)`` in FP32; ``P`` is
recomputed from the saved FP32 ``lse``. Every prefill launch (forward, dK/dV, dQ) is a 1-D grid
ordered longest programs first (``_heavy_first``); the order never changes a bit. A dK/dV kernel
owns one KV block of one KV head of one sequence and loops, in a fixed order, over the query heads of its group and, for each head, over
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

from rl_engine.ops._triton_common import FP_FUSION, cdiv, fragment_row_sum, gpu_facts, mma, upcast_dots
from rl_engine.ops.attention._checks import LaunchPlan

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
QK_AHEAD = False
"""Whether the prefill forward issues the scores of KV block j + 1 before block j's softmax (the blocks
every row sees whole; FlashAttention-3's overlap of the exponentials with the next ``q kᵀ``). The same
operations on the same values in the same order per row, so the same bits (tested); only the
schedule changes. Off until a GPU run times it against the plain loop. Read at every launch."""
ROW_SUM_PINNED = True
"""Whether the forward's and decode's row sum of the probabilities runs in the fixed order of
:func:`~rl_engine.ops._triton_common.fragment_row_sum` (key index bits 0, 3, 4, 5, then 2, 1 for a
64-key block), and the backward's ``delta = rowsum(O * dO)`` in :func:`_head_dim_sum`'s (True), or
both as ``tl.sum`` (False, the default until ws1-c1-v8), whose order is the compiler's: on sm_90 Triton 3.6 adds each
thread's 16 probabilities left to right and its 8 delta products as a right fold, 3.9 both as
pairwise trees (``tools/attention_ptx_order.py``; docs/declared-arithmetic.md, "Sums whose order is
the Triton compiler's"), so with False the attention bits depend on the Triton version.
The pinned order is 3.9's, so under 3.9 both give the same bits; under 3.6 (the H200's) True
changes the Triton backend's attention bits, so it becomes the default with a gate on the H200
(and, for the cross-backend declaration of attention, a contract version). Read at every launch,
so a test can set it for a call."""


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _finite(x):
    """True where ``x`` is finite (False for NaN and +-inf), as FP32 compares."""
    return tl.abs(x.to(tl.float32)) < float("inf")


@triton.jit
def _absent_mma(a, b, acc, keep, UPCAST: tl.constexpr):
    """``acc + a @ b`` where the entries of ``a`` outside ``keep`` are *absent* (not ``0 * b``).

    ``a`` [M, K] holds exact zeros where ``keep`` [M, K] (bool) is False; ``b`` [K, N]. ``b`` is
    sanitised (non-finite -> 0, the identity on finite values), so a masked zero never meets a
    NaN/inf; an exact 0/1 count ``keep @ nonfinite(b)`` (integers <= K, exact in FP32) then puts NaN
    in every output element that a *kept* non-finite ``b`` value reaches, so a visible NaN/inf
    stays non-finite. For finite ``b`` the result is bitwise ``acc + a @ b`` (the same operands
    reach the same product; the count is 0). Only tiles holding masked entries call this.
    """
    b_ok = _finite(b)
    b_safe = tl.where(b_ok, b, 0.0).to(b.dtype)
    out = mma(a, b_safe, acc, UPCAST)
    count = mma(tl.where(keep, 1.0, 0.0).to(tl.bfloat16), tl.where(b_ok, 0.0, 1.0).to(tl.bfloat16),
                tl.zeros(acc.shape, dtype=tl.float32), UPCAST)
    return tl.where(count > 0.0, float("nan"), out)


@triton.jit
def _online_update(l_i, m_i, s, PINNED_SUM: tl.constexpr):
    """Online-softmax bookkeeping for one KV block of scores ``s`` (masked entries -inf).

    Returns ``(p, alpha, l_new, m_new)``; see the module's Design notes for why a block that is
    wholly masked for a row leaves that row's state bitwise unchanged. ``PINNED_SUM``: the row sum
    of ``p`` in :func:`~rl_engine.ops._triton_common.fragment_row_sum`'s order, else ``tl.sum``'s (the compiler's; :data:`ROW_SUM_PINNED`).
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.where(m_new == m_i, 1.0, tl.exp(m_i - m_ref))
    p = tl.exp(s - m_ref[:, None])
    if PINNED_SUM:
        l_i = l_i * alpha + fragment_row_sum(p)
    else:
        l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def _full_step(acc, l_i, m_i, s, v_base, offs_n, stride_vn, offs_dv, scale, UPCAST: tl.constexpr,
               PINNED_SUM: tl.constexpr):
    """One KV block that every real row sees whole, from its raw scores ``s = mma(q, kᵀ)``: scale, a
    visible -inf score made NaN, the online update, ``acc = mma(P, V, acc * alpha)``."""
    s = s * scale
    s = tl.where(s == float("-inf"), float("nan"), s)
    p, alpha, l_i, m_i = _online_update(l_i, m_i, s, PINNED_SUM)
    v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :])  # [BLOCK_N, DV]
    acc = mma(p.to(tl.bfloat16), v, acc * alpha[:, None], UPCAST)
    return acc, l_i, m_i


@triton.jit
def _kv_loop(acc, l_i, m_i, q, limit, k_base, v_base, stride_kn, stride_vn, kv_len, n_full, n_stop, scale, dv0,
             D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             UPCAST: tl.constexpr, PINNED_SUM: tl.constexpr, QK_AHEAD: tl.constexpr = False):
    """Online softmax over KV blocks ``[0, n_stop)`` in increasing order (rows see keys <= limit).

    Blocks ``[0, n_full)`` are visible to every real row of the tile (no masked entry; padding rows
    are never stored): the plain FlashAttention step. Blocks ``[n_full, n_stop)`` hold masked
    entries (causal diagonal, keys past ``kv_len``): there masked scores are -inf, masked
    probabilities exact zeros, and ``P @ V`` runs through :func:`_absent_mma`, so a NaN/inf value
    at a masked key cannot reach the row ("masked means absent", docs/declared-semantics.md).
    In both, a *visible* score of -inf (a non-finite q or k) becomes NaN, so it cannot silently
    drop the key.

    ``acc`` [BLOCK_M, DV] holds output columns ``[dv0, dv0 + DV)`` of the head (``DV = D``, ``dv0 = 0``
    except in a decode program that owns a slice of the head dim): the scores always use all D.
    """
    offs_d = tl.arange(0, D)
    offs_dv = dv0 + tl.arange(0, DV)
    offs_j = tl.arange(0, BLOCK_N)
    if QK_AHEAD:
        # The same steps, with the scores of block j + 1 issued before block j's softmax (FA3's
        # intra-warpgroup overlap: the tensor cores run q k^T while the FP32 units run the exponentials).
        if n_full > 0:
            kt = tl.load(k_base + offs_j[None, :].to(tl.int64) * stride_kn + offs_d[:, None])  # [D, BLOCK_N]
            s = mma(q, kt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
            for start_n in range(0, n_full - BLOCK_N, BLOCK_N):
                offs_n = start_n + offs_j
                kt = tl.load(k_base + (offs_n + BLOCK_N)[None, :].to(tl.int64) * stride_kn + offs_d[:, None])
                s_next = mma(q, kt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
                acc, l_i, m_i = _full_step(acc, l_i, m_i, s, v_base, offs_n, stride_vn, offs_dv, scale, UPCAST,
                                           PINNED_SUM)
                s = s_next
            acc, l_i, m_i = _full_step(acc, l_i, m_i, s, v_base, n_full - BLOCK_N + offs_j, stride_vn, offs_dv, scale,
                                       UPCAST, PINNED_SUM)
    else:
        for start_n in range(0, n_full, BLOCK_N):
            offs_n = start_n + offs_j
            kt = tl.load(k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None])  # [D, BLOCK_N]
            s = mma(q, kt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
            acc, l_i, m_i = _full_step(acc, l_i, m_i, s, v_base, offs_n, stride_vn, offs_dv, scale, UPCAST,
                                       PINNED_SUM)
    for start_n in range(n_full, n_stop, BLOCK_N):
        offs_n = start_n + offs_j
        in_kv = offs_n < kv_len
        kt = tl.load(k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                     mask=in_kv[None, :], other=0.0)  # [D, BLOCK_N]
        s = mma(q, kt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
        s = s * scale
        keep = offs_n[None, :] <= limit[:, None]
        s = tl.where(keep, tl.where(s == float("-inf"), float("nan"), s), float("-inf"))
        p, alpha, l_i, m_i = _online_update(l_i, m_i, s, PINNED_SUM)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :],
                    mask=in_kv[:, None], other=0.0)  # [BLOCK_N, DV]
        acc = _absent_mma(p.to(tl.bfloat16), v, acc * alpha[:, None], keep, UPCAST)
    return acc, l_i, m_i


@triton.jit
def _heavy_first(n_blocks, n_heads, REVERSE: tl.constexpr):
    """``(sequence, head, block)`` of this program in a 1-D grid of ``n_blocks * batch * n_heads``
    programs, ordered by decreasing causal work: the block index varies slowest (from the last
    block down when ``REVERSE``: a query block's work grows with its index in the forward and dQ
    kernels; from block 0 up in the dK/dV kernel, whose work shrinks with the key block's index),
    then the sequence, then the head (adjacent query heads share a KV head). GPUs start programs
    roughly in launch order, so the longest programs no longer start last and leave SMs idle at
    the end of the launch (longest-processing-time-first list scheduling). Only which program
    computes which tile changes: every tile's arithmetic, and so every bit, is the
    same as in any other order."""
    pid = tl.program_id(0)
    per_block = tl.num_programs(0) // n_blocks
    block = pid // per_block
    if REVERSE:
        block = n_blocks - 1 - block
    rest = pid % per_block
    return rest // n_heads, rest % n_heads, block


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, n_mblocks, n_heads,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_ot, stride_oh, stride_lh, scale,
                     GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     UPCAST: tl.constexpr, PINNED_SUM: tl.constexpr, QK_AHEAD: tl.constexpr = False):
    b, h, m_block = _heavy_first(n_mblocks, n_heads, True)
    m0 = m_block * BLOCK_M
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
        # KV blocks every real row of the tile sees whole: those below the first row's causal limit.
        n_full = ((k_len - q_len + m0 + 1) // BLOCK_N) * BLOCK_N
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, limit, k_base, v_base, stride_kt, stride_vt, k_len,
                                 n_full, n_stop, scale, 0, D, D, BLOCK_M, BLOCK_N, UPCAST, PINNED_SUM, QK_AHEAD)
        has = l_i != 0.0  # l = 0: no visible key (exact 0 out); l = NaN: a visible non-finite value
        out = tl.math.div_rn(acc, tl.where(has, l_i, 1.0)[:, None])
        tl.store(o_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(tl.bfloat16),
                 mask=row_ok[:, None])
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), 0.0)
        tl.store(lse_ptr + h * stride_lh + rows, lse, mask=row_ok)


@triton.jit
def _attn_decode_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, seqlens_ptr,
                        stride_qb, stride_qh, stride_kb, stride_kt, stride_kh,
                        stride_vb, stride_vt, stride_vh, stride_ob, stride_oh, scale,
                        GROUP: tl.constexpr, D: tl.constexpr, D_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PINNED_SUM: tl.constexpr):
    """Program ``(b, kvh, g * D_SPLIT + j)``: query heads ``[g*BLOCK_M, (g+1)*BLOCK_M)`` of KV group
    ``kvh`` of sequence ``b``, output columns ``[j*DV, (j+1)*DV)`` with ``DV = D / D_SPLIT``. Every
    program of a group computes the same full-D scores and softmax state (the same instructions on
    the same operands), so a column's bits do not depend on ``D_SPLIT`` as long as the P.V MMA's
    per-element reduction does not depend on its N width (tested on the H200)."""
    DV: tl.constexpr = D // D_SPLIT
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    g0 = (tl.program_id(2) // D_SPLIT) * BLOCK_M
    dv0 = (tl.program_id(2) % D_SPLIT) * DV
    n = tl.load(seqlens_ptr + b)
    offs_g = g0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_dv = dv0 + tl.arange(0, DV)
    row_ok = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    limit = tl.where(row_ok, n - 1, -1)
    k_base = kc_ptr + b * stride_kb + kvh * stride_kh
    v_base = vc_ptr + b * stride_vb + kvh * stride_vh
    acc = tl.zeros((BLOCK_M, DV), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, limit, k_base, v_base, stride_kt, stride_vt, n, (n // BLOCK_N) * BLOCK_N,
                             n, scale, dv0, D, DV, BLOCK_M, BLOCK_N, UPCAST, PINNED_SUM)
    out = tl.math.div_rn(acc, tl.where(l_i != 0.0, l_i, 1.0)[:, None])
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_dv[None, :], out.to(tl.bfloat16),
             mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _head_dim_sum(x, D: tl.constexpr):
    """Row sums of ``x`` [M, D] (D a power of two >= 8) in a fixed order: one addition per step,
    over the head-dim index's bits 0, 1, 2, then from the highest bit down to bit 3. With D = 128 and
    4 warps the delta kernel's layout gives each thread 8 consecutive columns of a row (bits 0-2) and
    16 lanes the rest, so this is the pairwise tree of each thread's 8 values and then the lane
    butterfly with offsets 8, 4, 2, 1: the order Triton 3.9 compiles ``tl.sum`` to there (3.6 adds
    the 8 values as a right fold). Each step sums an axis of size 2, so no compiler or layout can
    reorder it."""
    tl.static_assert(D >= 8, "_head_dim_sum is declared for D >= 8")
    M: tl.constexpr = x.shape[0]
    G: tl.constexpr = D // 8
    y = tl.reshape(x, (M, G, 4, 2))
    y = tl.sum(y, axis=3)  # bit 0 -> (M, G, 4)
    y = tl.sum(tl.reshape(y, (M, G, 2, 2)), axis=3)  # bit 1 -> (M, G, 2)
    y = tl.sum(y, axis=2)  # bit 2 -> (M, G)
    for i in tl.static_range(G.bit_length() - 1):  # the remaining bits, highest first
        y = tl.sum(tl.reshape(y, (M, 2, G >> (i + 1))), axis=1)
    return tl.reshape(y, (M,))


@triton.jit
def _attn_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, T, stride_ot, stride_oh, stride_dot, stride_doh, stride_dh,
                           D: tl.constexpr, BLOCK_T: tl.constexpr, PINNED_SUM: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    offs_d = tl.arange(0, D)
    ok = rows < T
    r64 = rows.to(tl.int64)
    o = tl.load(o_ptr + r64[:, None] * stride_ot + h * stride_oh + offs_d[None, :], mask=ok[:, None], other=0.0)
    do = tl.load(do_ptr + r64[:, None] * stride_dot + h * stride_doh + offs_d[None, :], mask=ok[:, None], other=0.0)
    if PINNED_SUM:
        delta = _head_dim_sum(o.to(tl.float32) * do.to(tl.float32), D)
    else:
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + h * stride_dh + r64, delta, mask=ok)


@triton.jit
def _dkdv_step(k, v, q, do, lse, delta, offs_n, offs_m, n_ok, m_ok, offset, scale, dk, dv,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ABSENT: tl.constexpr, UPCAST: tl.constexpr):
    """One query step of the dK/dV kernel: ``dv += P^T dO`` and ``dk += dS^T Q`` for the
    ``[BLOCK_N, D]`` keys ``k`` / values ``v`` against the ``[BLOCK_M, D]`` query rows ``q`` / ``do``
    (FP32 ``lse`` / ``delta`` per row). ``ABSENT``: the step holds masked terms (the causal
    diagonal), which are made absent (:func:`_absent_mma`); else every row sees every key but rows
    past the sequence (``m_ok`` False, loaded as zeros) count zero."""
    st = mma(k, tl.trans(q), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), UPCAST) * scale
    visible = (offs_n[:, None] <= (offset + offs_m)[None, :]) & m_ok[None, :] & n_ok[:, None]
    pt = tl.where(visible, tl.exp(st - lse[None, :]), 0.0)
    if ABSENT:
        dv = _absent_mma(pt.to(tl.bfloat16), do, dv, visible, UPCAST)
    else:
        dv = mma(pt.to(tl.bfloat16), do, dv, UPCAST)
    dpt = mma(v, tl.trans(do), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), UPCAST)
    if ABSENT:
        dst = tl.where(visible, pt * (dpt - delta[None, :]), 0.0)
        dk = _absent_mma(dst.to(tl.bfloat16), q, dk, visible, UPCAST)
    else:
        dst = pt * (dpt - delta[None, :])
        dk = mma(dst.to(tl.bfloat16), q, dk, UPCAST)
    return dk, dv


@triton.jit
def _dkdv_rows(q_ptr, do_ptr, lse_ptr, delta_ptr, q_start, q_len, m0, h, stride_qt, stride_qh, stride_dot,
               stride_doh, stride_lh, BLOCK_M: tl.constexpr, D: tl.constexpr):
    """The query rows ``[m0, m0 + BLOCK_M)`` of head ``h`` (pointer loads; rows past ``q_len`` are
    zeros): ``(offs_m, m_ok, q, do, lse, delta)``."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    m_ok = offs_m < q_len
    qrows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + qrows[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    do = tl.load(do_ptr + qrows[:, None] * stride_dot + h * stride_doh + offs_d[None, :],
                 mask=m_ok[:, None], other=0.0)
    lse = tl.load(lse_ptr + h * stride_lh + qrows, mask=m_ok, other=0.0)
    delta = tl.load(delta_ptr + h * stride_lh + qrows, mask=m_ok, other=0.0)
    return offs_m, m_ok, q, do, lse, delta


@triton.jit
def _dkdv_steps(q_ptr, do_ptr, lse_ptr, delta_ptr, k, v, dk, dv, m_lo, m_hi, q_start, q_len, h, offs_n, n_ok, offset,
                scale, stride_qt, stride_qh, stride_dot, stride_doh, stride_lh, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, D: tl.constexpr, ABSENT: tl.constexpr, UPCAST: tl.constexpr):
    """:func:`_dkdv_step` over the query blocks ``[m_lo, m_hi)`` of head ``h`` in increasing order,
    loaded by pointer (:func:`_dkdv_rows`)."""
    for m0 in range(m_lo, m_hi, BLOCK_M):
        offs_m, m_ok, q, do, lse, delta = _dkdv_rows(q_ptr, do_ptr, lse_ptr, delta_ptr, q_start, q_len, m0, h,
                                                     stride_qt, stride_qh, stride_dot, stride_doh, stride_lh,
                                                     BLOCK_M, D)
        dk, dv = _dkdv_step(k, v, q, do, lse, delta, offs_n, offs_m, n_ok, m_ok, offset, scale, dk, dv,
                            BLOCK_M, BLOCK_N, ABSENT, UPCAST)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_q_ptr, cu_k_ptr,
                          n_nblocks, n_kv_heads, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                          stride_dot, stride_doh, stride_lh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                          scale, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, q_desc=None, do_desc=None,
                          TMA: tl.constexpr = False):
    """dK, dV of one ``[BLOCK_N]`` block of keys of one KV head: the ``GROUP`` query heads in turn,
    each over its query blocks in increasing order (the causal diagonal's blocks first, with the
    masked terms absent, then the blocks every row of which sees every key). ``TMA``: the complete
    query blocks of the second loop load ``q`` / ``dO`` through the descriptors ``q_desc`` /
    ``do_desc`` (``[T, H * D]`` views, ``[BLOCK_M, D]`` blocks), which the compiler pipelines; a
    last partial block still loads by pointer with the rows past the sequence as zeros. The same
    blocks in the same order with the same arithmetic, so the same bits."""
    b, kvh, n_block = _heavy_first(n_nblocks, n_kv_heads, False)
    n0 = n_block * BLOCK_N
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
        # Query blocks [m_begin, m_full) hold rows that cannot see some keys of this block (the
        # causal diagonal): there the masked terms are made absent. From m_full on, every row of a
        # query block sees every key of the block: the plain FlashAttention-2 step.
        first_full = tl.maximum(n0 + BLOCK_N - 1 - offset, 0)  # first query that sees the whole block
        m_full = tl.minimum(tl.maximum(((first_full + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, m_begin), q_len)
        # with TMA, [m_full, m_whole) are the complete blocks; a partial last block follows by pointer
        m_whole = m_full
        if TMA:
            m_whole = m_full + ((q_len - m_full) // BLOCK_M) * BLOCK_M
        for g in range(GROUP):
            h = kvh * GROUP + g
            dk, dv = _dkdv_steps(q_ptr, do_ptr, lse_ptr, delta_ptr, k, v, dk, dv, m_begin, m_full, q_start, q_len, h,
                                 offs_n, n_ok, offset, scale, stride_qt, stride_qh, stride_dot, stride_doh, stride_lh,
                                 BLOCK_M, BLOCK_N, D, True, UPCAST)
            if TMA:
                for m0 in range(m_full, m_whole, BLOCK_M):
                    offs_m = m0 + tl.arange(0, BLOCK_M)
                    qrows = (q_start + offs_m).to(tl.int64)
                    q = q_desc.load([q_start + m0, h * D])
                    do = do_desc.load([q_start + m0, h * D])
                    lse = tl.load(lse_ptr + h * stride_lh + qrows)
                    delta = tl.load(delta_ptr + h * stride_lh + qrows)
                    dk, dv = _dkdv_step(k, v, q, do, lse, delta, offs_n, offs_m, n_ok, offs_m < q_len, offset, scale,
                                        dk, dv, BLOCK_M, BLOCK_N, False, UPCAST)
            dk, dv = _dkdv_steps(q_ptr, do_ptr, lse_ptr, delta_ptr, k, v, dk, dv, m_whole, q_len, q_start, q_len, h,
                                 offs_n, n_ok, offset, scale, stride_qt, stride_qh, stride_dot, stride_doh, stride_lh,
                                 BLOCK_M, BLOCK_N, D, False, UPCAST)
        dk = dk * scale
        tl.store(dk_ptr + krows[:, None] * stride_dkt + kvh * stride_dkh + offs_d[None, :], dk.to(tl.bfloat16),
                 mask=n_ok[:, None])
        tl.store(dv_ptr + krows[:, None] * stride_dvt + kvh * stride_dvh + offs_d[None, :], dv.to(tl.bfloat16),
                 mask=n_ok[:, None])


@triton.jit
def _attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q_ptr, cu_k_ptr, n_mblocks,
                        n_heads, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                        stride_dot, stride_doh, stride_lh, stride_dqt, stride_dqh, scale,
                        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        UPCAST: tl.constexpr):
    b, h, m_block = _heavy_first(n_mblocks, n_heads, True)
    m0 = m_block * BLOCK_M
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
        # KV blocks [0, n_full) are seen whole by every real row (plain step); [n_full, n_stop)
        # hold masked keys (causal diagonal, keys past k_len), whose terms are made absent.
        n_full = ((offset + m0 + 1) // BLOCK_N) * BLOCK_N
        dq = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        for start_n in range(0, n_full, BLOCK_N):
            offs_n = start_n + offs_j
            k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kt + offs_d[None, :])  # [BLOCK_N, D]
            v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vt + offs_d[None, :])
            s = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST) * scale
            visible = offs_n[None, :] <= limit[:, None]
            p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
            dp = mma(do, tl.trans(v), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
            ds = p * (dp - delta[:, None])
            dq = mma(ds.to(tl.bfloat16), k, dq, UPCAST)
        for start_n in range(n_full, n_stop, BLOCK_N):
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
            ds = tl.where(visible, p * (dp - delta[:, None]), 0.0)
            dq = _absent_mma(ds.to(tl.bfloat16), k, dq, visible, UPCAST)
        dq = dq * scale
        tl.store(dq_ptr + qrows[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :], dq.to(tl.bfloat16),
                 mask=m_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def attention_fwd(q, k, v, cu_q, cu_k, scale: float, plan: LaunchPlan, *, block_m: int = BLOCK_M,
                  block_n: int = 0, num_warps: int = NUM_WARPS,
                  num_stages: int = NUM_STAGES, qk_ahead: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the varlen forward; returns (out [Tq, H, D] bf16, lse [H, Tq] fp32).

    ``plan``: the host facts of the validated call (``batch``, ``max_lq``, ``max_lk``). The keyword
    arguments are parameters only so tests, the negative control and benchmarks can vary them
    (``block_n`` 0 is :data:`BLOCK_N`, ``qk_ahead`` None is :data:`QK_AHEAD`); the public path always
    uses the module constants.
    """
    block_n = block_n or BLOCK_N
    qk_ahead = QK_AHEAD if qk_ahead is None else qk_ahead
    tq, h, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((tq, h, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    if tq == 0 or plan.batch == 0:
        return out, lse
    n_mblocks = cdiv(plan.max_lq, block_m)
    grid = (n_mblocks * plan.batch * h,)
    _attn_fwd_kernel[grid](
        q, k, v, out, lse, cu_q, cu_k, n_mblocks, h,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), float(scale),
        GROUP=h // hkv, D=d, BLOCK_M=block_m, BLOCK_N=block_n, UPCAST=upcast_dots(), PINNED_SUM=ROW_SUM_PINNED,
        QK_AHEAD=bool(qk_ahead), num_warps=num_warps, num_stages=num_stages,
        enable_fp_fusion=FP_FUSION,
    )
    return out, lse


def decode_launch(programs: int, d: int) -> tuple[int, int]:
    """``(d_split, num_stages)`` of a decode launch with ``programs = B * Hkv * ceil(GROUP / BLOCK_M_DECODE)``
    (sequence, KV group) tiles: the head dim is halved while the grid has fewer than
    :data:`DECODE_SPLIT_BELOW_PROGRAMS` programs (at most :data:`DECODE_MAX_D_SPLIT` slices, each at
    least :data:`DECODE_MIN_DV` wide), and a grid of at most :data:`DECODE_DEEP_PIPELINE_PROGRAMS`
    programs keeps 3 KV blocks in flight instead of 2. A speed choice that depends only on B and
    the head shapes; every configuration gave the same bits on the H200
    (``tools/attention_decode_sweep.py``, ``evidence/2026-12-01-h200-decode-5c38f19/``), and the
    split is tested to keep the prefill rows' bits."""
    split = 1
    while (programs * split < DECODE_SPLIT_BELOW_PROGRAMS and split < DECODE_MAX_D_SPLIT
           and d % (2 * split) == 0 and d // (2 * split) >= DECODE_MIN_DV):
        split *= 2
    stages = 3 if programs * split <= DECODE_DEEP_PIPELINE_PROGRAMS else NUM_STAGES
    return split, stages


DECODE_SPLIT_BELOW_PROGRAMS = 64
"""Split the head dim while a decode launch has fewer programs than this. On the H200 (sweep at
5c38f19, Qwen3-8B heads) B = 1 (8 programs) ran 23.6 us unsplit and 16.0 us in 8 slices at context
1024 (184.9 -> 108.6 us at 8192: each program still walks every KV block in turn, so a small batch
stays latency-bound); at B = 16 (128 programs) every split was slower."""
DECODE_MAX_D_SPLIT = 8
DECODE_MIN_DV = 16
DECODE_DEEP_PIPELINE_PROGRAMS = 256
"""Grids up to this many programs run 3 pipeline stages: B = 16 went from 222 to 149 us at context
8192 (0.57 -> 0.85 of copy bandwidth), while at B = 64 (512 programs) 2 stages stayed faster."""


def attention_decode_fwd(q, k_cache, v_cache, cache_seqlens, scale: float, *, block_m: int = BLOCK_M_DECODE,
                         block_n: int = BLOCK_N, num_warps: int = NUM_WARPS,
                         num_stages: int = 0, d_split: int = 0) -> torch.Tensor:
    """Launch one decode step; returns out [B, H, D] bf16 (validated inputs, no host reads).

    ``d_split`` and ``num_stages`` (0: :func:`decode_launch`): programs per (sequence, KV group) that each own
    ``D / d_split`` output columns; the keyword arguments are parameters so tests and the sweep
    (``tools/attention_decode_sweep.py``) can vary them."""
    bsz, h, d = q.shape
    hkv = k_cache.shape[2]
    group = h // hkv
    out = torch.empty((bsz, h, d), dtype=torch.bfloat16, device=q.device)
    if bsz == 0:
        return out
    gblocks = cdiv(group, block_m)
    auto_split, auto_stages = decode_launch(bsz * hkv * gblocks, d)
    d_split = d_split or auto_split
    num_stages = num_stages or auto_stages
    if d % d_split:
        raise ValueError(f"d_split {d_split} does not divide the head dim {d}")
    grid = (bsz, hkv, gblocks * d_split)
    _attn_decode_kernel[grid](
        q, k_cache, v_cache, out, cache_seqlens,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), float(scale),
        GROUP=group, D=d, D_SPLIT=d_split, BLOCK_M=block_m, BLOCK_N=block_n, UPCAST=upcast_dots(),
        PINNED_SUM=ROW_SUM_PINNED,
        num_warps=num_warps, num_stages=num_stages,
        enable_fp_fusion=FP_FUSION,
    )
    return out


def _launch_with_step(launch: tuple[int, ...] | None, default: tuple[int, int, int],
                      step: int) -> tuple[int, int, int, int]:
    """A backward launch ``(rows, warps, stages[, step])`` with its step filled in (``default`` and
    ``step`` when ``launch`` is None); the step must be a multiple of 16 (the tensor cores' chunk)."""
    out = tuple(launch or default)
    if len(out) == 3:
        out = (*out, step)
    if len(out) != 4 or out[3] % 16 or out[3] <= 0:
        raise ValueError(f"a backward launch is (rows, warps, stages[, step]) with a step that is a positive "
                         f"multiple of 16, got {launch!r}")
    return out


DKDV_TMA_ON_CUDA = False
"""Whether the dK/dV kernel loads its complete query blocks through TMA descriptors on a GPU of
compute capability >= 9.0 where :func:`use_dkdv_tma` allows: the same blocks and arithmetic as the
pointer loads (tested bit for bit in the interpreter), so a launch setting. Both forms are
software-pipelined on sm_90 (TMA copies, or cp.async for the pointer loads); TMA spares the
address arithmetic of every step. Off until the H200 sweep (``tools/attention_prefill_sweep.py``,
a ``t`` after the dK/dV launch) has timed it."""


def _rows_desc_ok(x: torch.Tensor) -> bool:
    """Whether ``x [T, H, D]`` bf16 can be read as a ``[T, H * D]`` TMA view: heads adjacent
    (``stride(1) == D``), unit stride on D, a 16-byte aligned base and row pitch."""
    t, h, d = x.shape
    return (t > 0 and x.stride(2) == 1 and (h == 1 or x.stride(1) == d) and x.data_ptr() % 16 == 0
            and (x.stride(0) * x.element_size()) % 16 == 0 and x.stride(0) >= h * d)


def use_dkdv_tma(q: torch.Tensor, do: torch.Tensor) -> bool:
    """Whether the dK/dV kernel's complete query blocks load through TMA: :data:`DKDV_TMA_ON_CUDA`,
    a GPU of compute capability >= 9.0 (never the interpreter) and ``q``, ``do`` readable as
    ``[T, H * D]`` views (:func:`_rows_desc_ok`). Depends on the device and layouts only."""
    return (DKDV_TMA_ON_CUDA and q.device.type == "cuda" and not upcast_dots() and gpu_facts(q.device)[0] >= 9
            and _rows_desc_ok(q) and _rows_desc_ok(do))


def _rows_desc(x: torch.Tensor, block_m: int):
    """The ``[T, H * D]`` TMA view of ``x [T, H, D]`` with ``[block_m, D]`` blocks."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t, h, d = x.shape
    return TensorDescriptor(x, [t, h * d], [x.stride(0), 1], [block_m, d])


def attention_bwd(q, k, v, out, lse, do, cu_q, cu_k, scale: float, plan: LaunchPlan, *,
                  dkdv_launch: tuple[int, ...] | None = None,
                  dq_launch: tuple[int, ...] | None = None, dkdv_tma: bool | None = None):
    """Launch the deterministic backward; returns (dq, dk, dv) bf16 (do bf16, unit stride on D).

    ``dkdv_launch`` = (KV rows per program, warps, stages[, query rows per step]) of the dK/dV
    kernel and ``dq_launch`` = (query rows per program, warps, stages[, KV rows per step]) of the
    dQ kernel are parameters only so the sweep (``tools/attention_prefill_sweep.py --backward``)
    can vary them; None is the module's ``(BLOCK_N_BWD, NUM_WARPS, NUM_STAGES, BLOCK_M_BWD)`` /
    ``(BLOCK_M, NUM_WARPS, NUM_STAGES, BLOCK_N_BWD)``, what the op always runs. A step is the
    reduction's block (query rows for dK / dV, keys for dQ): each gradient element is still one FP32
    accumulator fed in increasing order, and a step that is a multiple of 16 keeps the tensor
    cores' 16-wide chunks where they were, so the sweep checks the bits of other steps (the CPU
    interpreter, which adds one product at a time, gives the same bits for any step; tested).
    ``dkdv_tma``: the dK/dV kernel's complete query blocks through TMA descriptors (None:
    :func:`use_dkdv_tma`); True where ``q`` / ``do`` cannot be read so raises ``ValueError``."""
    kv_rows, kv_warps, kv_stages, m_step = _launch_with_step(dkdv_launch, (BLOCK_N_BWD, NUM_WARPS, NUM_STAGES),
                                                             BLOCK_M_BWD)
    q_rows, q_warps, q_stages, n_step = _launch_with_step(dq_launch, (BLOCK_M, NUM_WARPS, NUM_STAGES), BLOCK_N_BWD)
    if dkdv_tma is None:
        dkdv_tma = use_dkdv_tma(q, do)
    elif dkdv_tma and not (_rows_desc_ok(q) and _rows_desc_ok(do)):
        raise ValueError("the dK/dV kernel's TMA loads need q and do readable as [T, H * D] views (heads adjacent, "
                         "unit stride on D, 16-byte aligned base and row pitch)")
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
        _attn_bwd_delta_kernel[(cdiv(tq, BLOCK_T_DELTA), h)](
            out, do, delta, tq, out.stride(0), out.stride(1), do.stride(0), do.stride(1), delta.stride(0),
            D=d, BLOCK_T=BLOCK_T_DELTA, PINNED_SUM=ROW_SUM_PINNED, num_warps=NUM_WARPS,
            enable_fp_fusion=FP_FUSION,
        )
    n_nblocks = cdiv(plan.max_lk, kv_rows)
    q_desc = do_desc = None
    if dkdv_tma and tq:
        q_desc, do_desc = _rows_desc(q, m_step), _rows_desc(do, m_step)
    _attn_bwd_dkdv_kernel[(n_nblocks * plan.batch * hkv,)](
        q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, n_nblocks, hkv,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), lse.stride(0), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        float(scale), GROUP=group, D=d, BLOCK_M=m_step, BLOCK_N=kv_rows, UPCAST=up, q_desc=q_desc, do_desc=do_desc,
        TMA=q_desc is not None, num_warps=kv_warps, num_stages=kv_stages,
        enable_fp_fusion=FP_FUSION,
    )
    if tq:
        n_mblocks = cdiv(plan.max_lq, q_rows)
        _attn_bwd_dq_kernel[(n_mblocks * plan.batch * h,)](
            q, k, v, do, lse, delta, dq, cu_q, cu_k, n_mblocks, h,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), lse.stride(0), dq.stride(0), dq.stride(1), float(scale),
            GROUP=group, D=d, BLOCK_M=q_rows, BLOCK_N=n_step, UPCAST=up,
            num_warps=q_warps, num_stages=q_stages,
            enable_fp_fusion=FP_FUSION,
        )
    return dq, dk, dv
