"""Triton fused linear log-probabilities: ``log_softmax((hidden @ weight.T) / temperature)[target]``
without a ``[T, V]`` logits buffer, forward and backward.

Logits tiles ``[BLOCK_M, BLOCK_V]`` come from the FP32 accumulator of ``mma`` over E (BF16
operands, E looped in fixed ``BLOCK_E`` chunks in increasing order) and are never rounded to BF16
(contract ``declared_exceptions.logits_for_scoring``, ``docs/pitfalls.md`` P5).
On a GPU of compute capability >= 9.0 the hidden and weight blocks of those tiles arrive through
TMA descriptors (:func:`use_tma`), elsewhere through masked pointer loads: the same blocks, zero
fill and ``mma`` sequence, so the same bits (tested).

Forward, two kernels:

1. ``_fwd_partial_kernel``, grid (row blocks, V chunks): each program walks the ``BLOCK_V`` tiles of
   one fixed ``CHUNK_V``-wide V chunk in increasing order with an online FP32 max / sum-exp per
   row, and records (max, sum-exp, target logit) of that chunk. The V split is a fixed function of
   V (a model constant), never of T, so decode (T = 1) still has ``cdiv(V, CHUNK_V)`` programs.
2. ``_fwd_combine_kernel``, one lane per row: merges the chunk partials in increasing chunk order,
   ``out = (z_t - m) - log(s)``; saves the row max ``m`` and ``log(s)`` (the FP32 lse in two parts).

Backward, per V chunk in increasing order (only a ``[T, CHUNK_V]`` FP32 buffer, never ``[T, V]``):

A. ``_bwd_dlogits_kernel``: recompute the logits tile exactly as forward, form
   ``dlogits = (g * onehot - g * exp((z - m) - log s)) / temperature`` in FP32 and store it for the
   chunk as a BF16 pair ``hi = bf16(dlogits)``, ``lo = bf16(dlogits - hi)`` (``hi + lo`` keeps 16
   significant bits, about 2^-17 relative; the BF16 outputs keep 8);
B. ``_bwd_dhidden_kernel``, one program per (row tile, E tile) (:data:`GRAD_TILE`): ``dhidden += hi @ weight_chunk +
   lo @ weight_chunk`` through ``mma`` with BF16 operands (exact products, FP32 accumulation, so
   tensor cores do the work), V in increasing order, accumulated in an FP32 ``[T, E]`` buffer across
   chunks and rounded to BF16 once after the last chunk;
C. ``_bwd_dweight_kernel``, one program per (V tile, E tile) of the chunk: ``dweight_chunk =
   hi^T @ hidden + lo^T @ hidden`` over ALL row blocks in increasing order, rounded to BF16 once.

(The first version ran B and C on FP32 operands with IEEE precision, i.e. on CUDA cores: 10.35 s
for T = 8192 at Qwen3-8B shapes on the H200, 182x the unfused PyTorch path.)

No atomics; every output element is written by one program. Each row's logprob and dhidden depend
only on that row (rows are independent in the math, and every row is reduced by the same lanes in
the same order whatever the launch), so they do not depend on T, neighbours or padding. Block
sizes are module constants; the forward's rows per tile and warps are chosen by T
(:func:`fwd_launch_for`: 16 rows per warp either way, tested bit for bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import (FP_FUSION, cdiv, divide, fragment_row_sum, gpu_facts, mma, tma_layout,
                                          upcast_dots)
from rl_engine.ops.logp import declared

BLOCK_M = 64
"""Rows per logits tile of the dlogits recompute (the forward's is a launch setting,
:func:`fwd_launch_for`)."""
BLOCK_V = 128
"""Vocabulary entries per logits tile."""
BLOCK_E = 64
"""Hidden-size chunk of the logits ``mma`` (E looped in increasing order; tails masked to 0, so a
tiny E such as 2 is padded to the minimum dot size)."""
CHUNK_V = 4096
"""Width of the fixed V chunks: forward partials and the backward ``[T, CHUNK_V]`` dlogits buffer."""
COMBINE_BLOCK = 128
"""Rows per program of the forward combine kernel."""
GRAD_BLOCK = 64
"""Reduction step of the backward GEMMs (V entries of dhidden, rows of dweight): each step is one
``mma`` of the ``hi`` part then one of the ``lo`` part, so this sets every element's sequence of
products (declared; never changed for speed)."""
GRAD_TILE = (128, 128, 8, 3)
"""Output tile ``[rows, columns]``, warps and pipeline stages of the two backward GEMMs. A launch
setting: each output element gets the same ``GRAD_BLOCK`` steps in the same order whatever the
tile (tested bit for bit against ``(64, 64, 4, 3)``, the tiles before issue #33, on the H200 too)."""
NUM_WARPS = 4
"""Warps per program of the linear_logp kernels other than the forward's partial kernel."""
FWD_LAUNCH = (128, 8, 3)
"""Rows per logits tile, warps and pipeline stages of the forward's partial kernel below
:data:`FWD_LONG_MIN_ROWS` rows: 16 rows per
warp, as the ``(BLOCK_M, NUM_WARPS, 3)`` launch before it, so each row's max and sum over a
``BLOCK_V`` tile are reduced by the same lanes in the same order. On the H200 (sweep at 7e5dac4,
``evidence/2026-12-03-h200-issue33-7e5dac4/``) it gave those bits at T = 4096 and 8192 and ran
10.8 ms instead of 12.4 ms at T = 4096; ``(64, 8, 3)`` (8 rows per warp) changed the bits."""
FWD_LAUNCH_LONG = (256, 16, 3)
"""The partial kernel's launch from :data:`FWD_LONG_MIN_ROWS` rows: still 16 rows per warp, so the
same lanes reduce each row's max and sum in the same order. In the H200 sweep at 8a250b2 (TMA
tiles, ``evidence/2026-12-04-h200-issue33-8a250b2/``) it gave :data:`FWD_LAUNCH`'s bits at T = 4096
and 8192 and ran 17.2 ms instead of 18.5 ms at T = 8192 (8.9 instead of 9.3 at 4096)."""
FWD_LONG_MIN_ROWS = 2048
"""Rows from which the forward takes :data:`FWD_LAUNCH_LONG`; fewer rows (decode, short scoring
calls) keep the 128-row tiles, whose row tile is half as much work when most rows are padding."""


ROW_SUM_PINNED = True
"""Whether the forward's per-tile row sum of ``exp(z - ref)`` runs in
:func:`~rl_engine.ops._triton_common.fragment_row_sum`'s fixed order (True) or as ``tl.sum``
(False, the default until ws1-c1-v8), whose order is the compiler's: read from the sm_90 PTX, Triton 3.6 (the
H200's) adds each thread's 32 values of a row left to right, 3.9 as a tree, so with False the
forward's bits depend on the Triton version (as the attention's ``ROW_SUM_PINNED`` explains).
True, the default since ws1-c1-v8, changes the forward's bits on either version. Read at every launch, so a test can set it for a call."""


def fwd_launch_for(t: int) -> tuple[int, int, int]:
    """The partial kernel's (rows per logits tile, warps, stages) for ``t`` rows: a launch setting
    chosen by T, which no row's bits depend on (tested against 64- and 128-row tiles)."""
    return FWD_LAUNCH_LONG if t >= FWD_LONG_MIN_ROWS else FWD_LAUNCH


LOGITS_TMA_ON_CUDA = True
"""Whether the logits tiles (the forward's partial kernel and the backward's dlogits recompute)
load their hidden and weight blocks through TMA descriptors where :func:`use_tma` allows: the
same blocks and ``mma`` sequence as the masked pointer loads (tested bit for bit), so a launch
setting, not a declared semantic."""


# --------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _logits_tile(h_src, w_src, rows, row_ok, cols, row0, v0, V, E, stride_h, stride_w, temperature,
                 BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, UPCAST: tl.constexpr,
                 TMA: tl.constexpr, DIV_RN: tl.constexpr):
    """``(hidden[rows] @ weight[cols].T) / temperature`` as an FP32 [BLOCK_M, BLOCK_V] tile (the
    division IEEE-rounded with ``DIV_RN``, the declared sequence; else Triton's ``div.full.f32``).

    ``TMA``: ``h_src`` / ``w_src`` are tensor descriptors of hidden ``[T, E]`` (block
    ``[BLOCK_M, BLOCK_E]``) and weight ``[V, E]`` (block ``[BLOCK_V, BLOCK_E]``) and the tile is the
    one at ``(row0, v0)``; rows, columns and E past the ends are zero-filled by the TMA unit, as the
    masked loads of the pointer form fill them, so both forms run the same ``mma`` sequence on the
    same operands (tested bit for bit). Otherwise they are the tensors' pointers."""
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    if TMA:
        for k0 in range(0, E, BLOCK_E):
            h = h_src.load([row0, k0])
            w = w_src.load([v0, k0]).T
            acc = mma(h, w, acc, UPCAST)
    else:
        ks = tl.arange(0, BLOCK_E)
        col_ok = cols < V
        for k0 in range(0, E, BLOCK_E):
            kk = k0 + ks
            k_ok = kk < E
            h = tl.load(h_src + rows[:, None] * stride_h + kk[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_src + cols[None, :].to(tl.int64) * stride_w + kk[:, None],
                        mask=col_ok[None, :] & k_ok[:, None], other=0.0)
            acc = mma(h, w, acc, UPCAST)
    return divide(acc, temperature, DIV_RN)


@triton.jit
def _fwd_partial_kernel(
    h_ptr, w_ptr, tgt_ptr, pmax_ptr, psum_ptr, ptgt_ptr,
    T, V, E, n_chunks, stride_h, stride_w, stride_t, temperature,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK_V: tl.constexpr,
    UPCAST: tl.constexpr, TMA: tl.constexpr, PINNED_SUM: tl.constexpr, DIV_RN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    chunk = tl.program_id(1)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = rows < T
    tgt = tl.load(tgt_ptr + rows * stride_t, mask=row_ok, other=-1)
    run_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    tgt_logit = tl.full([BLOCK_M], float("-inf"), tl.float32)
    v_lo = chunk * CHUNK_V
    v_hi = tl.minimum(v_lo + CHUNK_V, V)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        z = _logits_tile(h_ptr, w_ptr, rows, row_ok, cols, pid_m * BLOCK_M, v0, V, E, stride_h, stride_w,
                         temperature, BLOCK_M, BLOCK_V, BLOCK_E, UPCAST, TMA, DIV_RN)
        z = tl.where((cols < V)[None, :], z, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(z, axis=1))
        ref = tl.where(new_max == float("-inf"), 0.0, new_max)
        if PINNED_SUM:
            run_sum = run_sum * tl.exp(run_max - ref) + fragment_row_sum(tl.exp(z - ref[:, None]))
        else:
            run_sum = run_sum * tl.exp(run_max - ref) + tl.sum(tl.exp(z - ref[:, None]), axis=1)
        run_max = new_max
        hit = cols[None, :] == tgt[:, None]
        tgt_logit = tl.maximum(tgt_logit, tl.max(tl.where(hit, z, float("-inf")), axis=1))
    offs = rows * n_chunks + chunk
    tl.store(pmax_ptr + offs, run_max, mask=row_ok)
    tl.store(psum_ptr + offs, run_sum, mask=row_ok)
    tl.store(ptgt_ptr + offs, tgt_logit, mask=row_ok)


@triton.jit
def _fwd_combine_kernel(pmax_ptr, psum_ptr, ptgt_ptr, out_ptr, rmax_ptr, rlog_ptr, T, n_chunks,
                        BLOCK: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    ok = rows < T
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], dtype=tl.float32)
    tgt_logit = tl.full([BLOCK], float("-inf"), tl.float32)
    for c in range(0, n_chunks):
        offs = rows * n_chunks + c
        # rows past T read a harmless (max 0, sum 1) partial; their results are not stored
        pm = tl.load(pmax_ptr + offs, mask=ok, other=0.0)
        ps = tl.load(psum_ptr + offs, mask=ok, other=1.0)
        pt = tl.load(ptgt_ptr + offs, mask=ok, other=float("-inf"))
        new_max = tl.maximum(run_max, pm)
        ref = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - ref) + ps * tl.exp(pm - ref)
        run_max = new_max
        tgt_logit = tl.maximum(tgt_logit, pt)
    log_sum = tl.log(run_sum)
    tl.store(out_ptr + rows, (tgt_logit - run_max) - log_sum, mask=ok)
    tl.store(rmax_ptr + rows, run_max, mask=ok)
    tl.store(rlog_ptr + rows, log_sum, mask=ok)


@triton.jit
def _bwd_dlogits_kernel(
    h_ptr, w_ptr, tgt_ptr, g_ptr, rmax_ptr, rlog_ptr, hi_ptr, lo_ptr,
    T, V, E, v_base, stride_h, stride_w, stride_t, temperature,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK_V: tl.constexpr,
    UPCAST: tl.constexpr, TMA: tl.constexpr, DIV_RN: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = rows < T
    local = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = v_base + local
    z = _logits_tile(h_ptr, w_ptr, rows, row_ok, cols, tl.program_id(0) * BLOCK_M, v_base + tl.program_id(1) * BLOCK_V,
                     V, E, stride_h, stride_w, temperature, BLOCK_M, BLOCK_V, BLOCK_E, UPCAST, TMA, DIV_RN)
    tgt = tl.load(tgt_ptr + rows * stride_t, mask=row_ok, other=-1)
    g = tl.load(g_ptr + rows, mask=row_ok, other=0.0)
    m = tl.load(rmax_ptr + rows, mask=row_ok, other=0.0)
    ls = tl.load(rlog_ptr + rows, mask=row_ok, other=0.0)
    p = tl.exp((z - m[:, None]) - ls[:, None])
    hit = cols[None, :] == tgt[:, None]
    d = divide(tl.where(hit, g[:, None], 0.0) - p * g[:, None], temperature, DIV_RN)
    # FP32 dlogits as an exact-enough BF16 pair: hi = bf16(d), lo = bf16(d - hi) (d - hi is exact
    # in FP32), so hi + lo carries 16 significant bits and the GEMMs below run on tensor cores.
    hi = d.to(tl.bfloat16)
    lo = (d - hi.to(tl.float32)).to(tl.bfloat16)
    offs = rows[:, None] * CHUNK_V + local[None, :]
    ok = row_ok[:, None] & (cols < V)[None, :]
    tl.store(hi_ptr + offs, hi, mask=ok)
    tl.store(lo_ptr + offs, lo, mask=ok)


@triton.jit
def _bwd_dhidden_kernel(
    hi_ptr, lo_ptr, w_ptr, acc_ptr, dh_ptr,
    T, E, v_base, n_local, stride_w,
    FIRST: tl.constexpr, LAST: tl.constexpr, CHUNK_V: tl.constexpr, BLOCK: tl.constexpr,
    UPCAST: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr,
):
    """``[TILE_M, TILE_N]`` of dhidden: ``+= hi @ w + lo @ w`` per ``BLOCK`` entries of the chunk's
    V, in increasing order (the tile shape never changes an element's sequence of products)."""
    rows = (tl.program_id(0) * TILE_M + tl.arange(0, TILE_M)).to(tl.int64)
    ecols = tl.program_id(1) * TILE_N + tl.arange(0, TILE_N)
    row_ok = rows < T
    e_ok = ecols < E
    out_mask = row_ok[:, None] & e_ok[None, :]
    if FIRST:
        acc = tl.zeros([TILE_M, TILE_N], dtype=tl.float32)
    else:
        acc = tl.load(acc_ptr + rows[:, None] * E + ecols[None, :], mask=out_mask, other=0.0)
    vs = tl.arange(0, BLOCK)
    for j in range(0, n_local, BLOCK):
        local = j + vs
        v_ok = local < n_local
        offs = rows[:, None] * CHUNK_V + local[None, :]
        d_ok = row_ok[:, None] & v_ok[None, :]
        d_hi = tl.load(hi_ptr + offs, mask=d_ok, other=0.0)
        d_lo = tl.load(lo_ptr + offs, mask=d_ok, other=0.0)
        w = tl.load(w_ptr + (v_base + local)[:, None].to(tl.int64) * stride_w + ecols[None, :],
                    mask=v_ok[:, None] & e_ok[None, :], other=0.0)
        acc = mma(d_hi, w, acc, UPCAST)
        acc = mma(d_lo, w, acc, UPCAST)
    if LAST:
        tl.store(dh_ptr + rows[:, None] * E + ecols[None, :], acc.to(tl.bfloat16), mask=out_mask)
    else:
        tl.store(acc_ptr + rows[:, None] * E + ecols[None, :], acc, mask=out_mask)


@triton.jit
def _bwd_dweight_kernel(
    hi_ptr, lo_ptr, h_ptr, dw_ptr,
    T, E, v_base, n_local, stride_h,
    CHUNK_V: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr, TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """``[TILE_M, TILE_N]`` of the chunk's dweight: ``hi^T @ hidden + lo^T @ hidden`` per ``BLOCK``
    rows, all rows in increasing order (the tile shape never changes an element's sequence)."""
    local = tl.program_id(0) * TILE_M + tl.arange(0, TILE_M)
    ecols = tl.program_id(1) * TILE_N + tl.arange(0, TILE_N)
    v_ok = local < n_local
    e_ok = ecols < E
    acc = tl.zeros([TILE_M, TILE_N], dtype=tl.float32)
    rs = tl.arange(0, BLOCK)
    for r0 in range(0, T, BLOCK):
        rows = (r0 + rs).to(tl.int64)
        row_ok = rows < T
        offs = rows[None, :] * CHUNK_V + local[:, None]
        d_ok = v_ok[:, None] & row_ok[None, :]
        d_hi = tl.load(hi_ptr + offs, mask=d_ok, other=0.0)
        d_lo = tl.load(lo_ptr + offs, mask=d_ok, other=0.0)
        h = tl.load(h_ptr + rows[:, None] * stride_h + ecols[None, :],
                    mask=row_ok[:, None] & e_ok[None, :], other=0.0)
        acc = mma(d_hi, h, acc, UPCAST)
        acc = mma(d_lo, h, acc, UPCAST)
    out_rows = (v_base + local).to(tl.int64)
    tl.store(dw_ptr + out_rows[:, None] * E + ecols[None, :], acc.to(tl.bfloat16),
             mask=v_ok[:, None] & e_ok[None, :])


# --------------------------------------------------------------------------------------------------
# launchers


def use_tma(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the logits tiles of ``hidden [T, E]`` and ``weight [V, E]`` load through TMA: on a
    GPU of compute capability >= 9.0 (:data:`LOGITS_TMA_ON_CUDA`), never under the interpreter,
    with both operands row-major, 16-byte aligned and with 16-byte row pitches (:func:`tma_layout`).
    Depends on the device and layouts only, never on T."""
    return (LOGITS_TMA_ON_CUDA and hidden.device.type == "cuda" and not upcast_dots()
            and gpu_facts(hidden.device)[0] >= 9 and tma_layout(hidden) is False and tma_layout(weight) is False)


def _logits_sources(hidden: torch.Tensor, weight: torch.Tensor, block_m: int, tma: bool):
    """(hidden source, weight source) of :func:`_logits_tile`: TMA descriptors of ``[block_m,
    BLOCK_E]`` and ``[BLOCK_V, BLOCK_E]`` blocks, or the tensors themselves (pointer loads)."""
    if not tma:
        return hidden, weight
    from triton.tools.tensor_descriptor import TensorDescriptor

    if tma_layout(hidden) is not False or tma_layout(weight) is not False:
        raise ValueError("the TMA logits tiles need row-major, 16-byte aligned hidden and weight")
    return (TensorDescriptor.from_tensor(hidden, [block_m, BLOCK_E]),
            TensorDescriptor.from_tensor(weight, [BLOCK_V, BLOCK_E]))


def linear_logp_fwd(hidden, weight, targets, temperature, fwd_launch=None, tma=None):
    """(logprobs, row max, log sum-exp) FP32 [T] of validated hidden [T, E], weight [V, E] bf16, targets [T].
    ``fwd_launch``: (rows per logits tile, warps, stages) of the partial kernel, for the sweep
    (``tools/linear_logp_sweep.py``); None is :func:`fwd_launch_for`, what the op runs. Rows are
    independent, so the row count per tile is a launch setting; BLOCK_V, BLOCK_E and CHUNK_V are
    declared and never vary. ``tma``: load the logits blocks through TMA descriptors (None:
    :func:`use_tma`); tests compare the two loads bit for bit."""
    block_m, warps, stages = fwd_launch or fwd_launch_for(hidden.shape[0])
    t, e = hidden.shape
    v = weight.shape[0]
    dev = hidden.device
    out = torch.empty(t, dtype=torch.float32, device=dev)
    rmax = torch.empty(t, dtype=torch.float32, device=dev)
    rlog = torch.empty(t, dtype=torch.float32, device=dev)
    if t == 0:
        return out, rmax, rlog
    n_chunks = cdiv(v, CHUNK_V)
    pmax = torch.empty((t, n_chunks), dtype=torch.float32, device=dev)
    psum = torch.empty_like(pmax)
    ptgt = torch.empty_like(pmax)
    up = upcast_dots()
    tma = use_tma(hidden, weight) if tma is None else tma
    h_src, w_src = _logits_sources(hidden, weight, block_m, tma)
    _fwd_partial_kernel[(cdiv(t, block_m), n_chunks)](
        h_src, w_src, targets, pmax, psum, ptgt,
        t, v, e, n_chunks, hidden.stride(0), weight.stride(0), targets.stride(0), temperature,
        BLOCK_M=block_m, BLOCK_V=BLOCK_V, BLOCK_E=BLOCK_E, CHUNK_V=CHUNK_V, UPCAST=up, TMA=tma,
        PINNED_SUM=ROW_SUM_PINNED or declared.DECLARED_LSE, DIV_RN=declared.DECLARED_LSE,
        num_warps=warps, num_stages=stages,
        enable_fp_fusion=FP_FUSION,
    )
    _fwd_combine_kernel[(cdiv(t, COMBINE_BLOCK),)](
        pmax, psum, ptgt, out, rmax, rlog, t, n_chunks, BLOCK=COMBINE_BLOCK, num_warps=NUM_WARPS,
        enable_fp_fusion=FP_FUSION,
    )
    return out, rmax, rlog


def linear_logp_bwd(hidden, weight, targets, g, rmax, rlog, temperature, need_dh, need_dw, grad_tile=None,
                    tma=None):
    """(dhidden [T, E] or None, dweight [V, E] or None) bf16 from the upstream g [T] FP32.
    ``grad_tile``: the backward GEMMs' (rows, columns, warps, stages); None: :data:`GRAD_TILE`.
    ``tma``: the dlogits recompute loads its logits blocks through TMA (None: :func:`use_tma`)."""
    tm, tn, tw, ts = grad_tile or GRAD_TILE
    t, e = hidden.shape
    v = weight.shape[0]
    dev = hidden.device
    dh = torch.empty((t, e), dtype=torch.bfloat16, device=dev) if need_dh else None
    dw = torch.empty((v, e), dtype=torch.bfloat16, device=dev) if need_dw else None
    if t == 0:
        if dw is not None:
            dw.zero_()
        return dh, dw
    g = g.reshape(t).to(torch.float32).contiguous()
    d_hi = torch.empty((t, CHUNK_V), dtype=torch.bfloat16, device=dev)
    d_lo = torch.empty_like(d_hi)
    n_chunks = cdiv(v, CHUNK_V)
    # FP32 dhidden accumulator across chunks (unused when one chunk covers V: FIRST and LAST)
    dh_acc = torch.empty((t, e) if (need_dh and n_chunks > 1) else (1,), dtype=torch.float32, device=dev)
    up = upcast_dots()
    tma = use_tma(hidden, weight) if tma is None else tma
    h_src, w_src = _logits_sources(hidden, weight, BLOCK_M, tma)
    for c in range(n_chunks):
        v_base = c * CHUNK_V
        n_local = min(CHUNK_V, v - v_base)
        _bwd_dlogits_kernel[(cdiv(t, BLOCK_M), cdiv(n_local, BLOCK_V))](
            h_src, w_src, targets, g, rmax, rlog, d_hi, d_lo,
            t, v, e, v_base, hidden.stride(0), weight.stride(0), targets.stride(0), temperature,
            BLOCK_M=BLOCK_M, BLOCK_V=BLOCK_V, BLOCK_E=BLOCK_E, CHUNK_V=CHUNK_V, UPCAST=up, TMA=tma,
            DIV_RN=declared.DECLARED_LSE, num_warps=NUM_WARPS,
            enable_fp_fusion=FP_FUSION,
        )
        if need_dh:
            _bwd_dhidden_kernel[(cdiv(t, tm), cdiv(e, tn))](
                d_hi, d_lo, weight, dh_acc, dh,
                t, e, v_base, n_local, weight.stride(0),
                FIRST=c == 0, LAST=c == n_chunks - 1, CHUNK_V=CHUNK_V, BLOCK=GRAD_BLOCK, UPCAST=up,
                TILE_M=tm, TILE_N=tn, num_warps=tw, num_stages=ts,
                enable_fp_fusion=FP_FUSION,
            )
        if need_dw:
            _bwd_dweight_kernel[(cdiv(n_local, tm), cdiv(e, tn))](
                d_hi, d_lo, hidden, dw,
                t, e, v_base, n_local, hidden.stride(0),
                CHUNK_V=CHUNK_V, BLOCK=GRAD_BLOCK, UPCAST=up, TILE_M=tm, TILE_N=tn, num_warps=tw, num_stages=ts,
                enable_fp_fusion=FP_FUSION,
            )
    return dh, dw
