"""Triton RMSNorm forward and backward, shared by ``rms_norm`` ([T, E]) and ``qk_norm``
([T, H, D], one row per (token, head)).

Rows: a row is ``x[t]`` ([T, E] input, H = 1) or ``x[t, h]`` ([T, H, D] input); rows are numbered
``r = t * H + h`` and addressed through the strides, so any layout with unit stride on the last
axis works without a copy.

The arithmetic is the declared one of ``docs/declared-arithmetic.md`` (the CUDA backend computes
the same function, so the two backends give the same bits):

* row sums (``sum(x^2)`` forward, ``sum(g * x)`` backward) in the fixed order of
  :func:`row_sum_fixed`: ``LANES`` = 128 lane sums, lane ``i`` adding columns ``i, i + 128, ...`` in
  increasing order, then a fixed pairwise tree over the lanes. The order depends only on E, never
  on T, on the row's neighbours or on its position;
* ``r = 1 / sqrt(sum(x^2) / E + eps)`` with IEEE division and square root (``div_rn``,
  ``sqrt_rn``; Triton's ``/`` and ``rsqrt`` are approximate on the GPU). The FP32 ``r`` of each
  row is kept for the backward;
* backward, from the FP32 definition ``y = w * x * r`` (the rounding order does not change it):
  ``g = dy * w``, ``dx = r * (g - x * ((sum(g * x) / E) * (r * r)))`` (FP32, rounded once);
  ``dweight = sum over rows of dy * (x * r)``: stage 1, each program walks a fixed chunk of
  ``ROWS_PER_PROGRAM`` = 64 rows in order and writes one FP32 partial [E]; stage 2 adds the
  partials in chunk order and rounds once. No atomics; the chunk size is a constant, never chosen
  from T. With few chunks (a [T, E] input of a few thousand rows) the backward runs split: dx one
  row per program and the stage-1 partials one program per (chunk, column block), the same
  per-element arithmetic in the same order (:data:`SPLIT_BELOW_PROGRAMS`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, next_power_of_2, row_sum_fixed, row_sum_fixed_rows
from rl_engine.ops.rms_norm._fused_args import check_fused_bwd_args

ROWS_PER_PROGRAM = 64
"""Rows per backward stage-1 program (fixed; sets the dweight partial-sum tree; the CUDA
backend's ``NORM_DW_ROWS``)."""
LANES = 128
"""Lane sums of the fixed row-sum order (the CUDA backend's ``NORM_THREADS``)."""
REDUCE_BLOCK = 64
"""Columns per dweight stage-2 program (a launch setting: each column's partial rows are added in
the same order whatever the block). The H200 sweep at 72f74f5 (``tools/rms_dw_reduce_sweep.py``,
``evidence/2026-12-04-h200-issue33-72f74f5/``): 64 columns ran 8.6 us where 256 ran 11.0 us for
64 partial rows of 4096 columns (13.1 against 16.9 us for 128 rows), and a QK-norm weight of 128
columns and 2048 partial rows took 116 us in two programs where one 256-column program took 195;
16 to 128 columns were within 3 % of each other, with the same bits."""
REDUCE_UNROLL = 8
"""Partial rows per unrolled step of the dweight stage-2 loop (a launch setting: the rows are
still added one at a time in increasing order)."""
SPLIT_BELOW_PROGRAMS = 264
"""The backward runs in its split form (one program per row for dx, one per 64-row chunk and
``DW_BLOCK`` columns for the dweight partials) when the fused form would have fewer programs
than this (two per H200 SM): a [4096, 4096] input has 64 chunks, so the fused form keeps 64 of
132 SMs busy walking 64 rows each. Same arithmetic and order per element, same bits (tested);
between fused and split the choice depends on the row count only (narrow rows take the rows form,
:data:`ROWS_FORM_MAX_BLOCK`)."""
DW_BLOCK = 256
"""Columns per stage-1 dweight program of the split form (a launch setting: each column's sum
is the same whatever the block)."""
ROWS_FORM_MAX_BLOCK = 256
"""Rows of at most this many (padded) columns, a QK-norm's heads of D = 128 among them, run the
backward's dx as ``[R, BLOCK]`` tiles of several rows per program (:func:`_rms_bwd_dx_rows_kernel`;
the fused QK-norm + RoPE forward, :func:`_norm_rope_rows_kernel`, always runs row tiles) and the dweight
partials in the split form's chunks: one 128-column row per program (or 64 rows in turn per
program, in the fused backward) left the H200 waiting on one row's loads at a time (the Qwen3-8B
training step's QK-norm backward: 122 us per launch, about 0.8 TB/s). Same per-row arithmetic,
same dweight order, same bits (tested); a launch setting, chosen from the row width only."""
ROWS_TILE_ELEMS = 2048
"""Elements per ``[R, max(BLOCK, LANES)]`` tile of the rows kernels (the lane sums are ``[R, LANES]``
whatever the row width): :func:`rows_per_program` rows per program, 16 at D = 128. A launch setting."""


def rows_per_program(block: int) -> int:
    """Rows per program of the rows kernels for rows of ``block`` (padded) columns: a power of two."""
    return max(1, ROWS_TILE_ELEMS // max(block, LANES))


DW_UNROLL = 8
"""Rows per unrolled step of the dweight stage-1 loop of the split form (a launch setting: the
rows are still added one at a time in order; the loads of a step can be in flight together)."""
FUSED_ADD_NORM = True
"""This module has the training form of the residual add + norm: :func:`add_rms_norm_train_fwd`
and ``residual_grad`` in :func:`rms_norm_bwd` (the op falls back to separate kernels and
``torch.add`` on a backend module without it)."""
ADD_WARPS = 2
"""Warps of the add-fused forward (:func:`add_rms_norm_fwd`, decode rows only). A launch setting,
not arithmetic: on the H200 at E = 4096 (``tools/rms_decode_sweep.py``, evidence
``2026-12-02-h200-decode-3dd21eb``) 2 warps took 2.54 us per launch at T = 1 against 3.17 us at
the 8 of :func:`_warps`, with the same bits at every warp count from 1 to 16. Rows wider than 4096
keep :func:`_warps` (more registers per thread otherwise)."""


def _block(n_cols: int) -> int:
    return next_power_of_2(n_cols)


def _warps(block: int) -> int:
    return 4 if block <= 1024 else (8 if block <= 4096 else 16)


@triton.jit
def _rms_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, d_ptr, s_ptr, n_cols, n_heads, eps, n_float,
                    stride_xt, stride_xh, stride_yt, stride_yh, stride_dt, stride_st,
                    BLOCK: tl.constexpr, HF_ORDER: tl.constexpr, LANES: tl.constexpr, CHUNKS: tl.constexpr,
                    ADD: tl.constexpr):
    """One row's norm. ``ADD`` (the residual add fused in, [T, E] rows only): the row normalised is
    ``s = bf16(x + d)`` (FP32 add, one rounding: the residual add's bits), stored to ``s``; every
    later step is the plain norm's, on the same BF16 values."""
    r = tl.program_id(0)
    t = (r // n_heads).to(tl.int64)
    h = (r % n_heads).to(tl.int64)
    base = x_ptr + t * stride_xt + h * stride_xh
    lanes = tl.zeros((LANES,), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):  # lane i adds columns i, i + LANES, ... in order
        lc = c * LANES + tl.arange(0, LANES)
        xc = tl.load(base + lc, mask=lc < n_cols, other=0.0).to(tl.float32)
        if ADD:
            dc = tl.load(d_ptr + t * stride_dt + lc, mask=lc < n_cols, other=0.0).to(tl.float32)
            xc = (xc + dc).to(tl.bfloat16).to(tl.float32)
        lanes += xc * xc
    ss = row_sum_fixed(lanes, LANES)
    rstd = tl.math.div_rn(tl.full((), 1.0, tl.float32), tl.math.sqrt_rn(tl.math.div_rn(ss, n_float) + eps))
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        sb = (x + tl.load(d_ptr + t * stride_dt + cols, mask=mask, other=0.0).to(tl.float32)).to(tl.bfloat16)
        tl.store(s_ptr + t * stride_st + cols, sb, mask=mask)
        x = sb.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = x * rstd
    if HF_ORDER:
        y = normed.to(tl.bfloat16).to(tl.float32) * w
    else:
        y = normed * w
    tl.store(y_ptr + t * stride_yt + h * stride_yh + cols, y.to(tl.bfloat16), mask=mask)
    tl.store(rstd_ptr + r, rstd)


@triton.jit
def _load_grad(dy_row, cols, mask, cos_row, sin_row, half, ROPE: tl.constexpr):
    """FP32 gradient of the norm's output at ``cols`` of one row. Without ``ROPE``: ``dy_row``'s
    values. With ``ROPE`` (the fused QK-norm + RoPE backward; one row is one head of D =
    2 * ``half`` columns): ``dy_row`` holds the gradient of the rotated output, and this is the
    rotation's backward exactly as :func:`rl_engine.ops.rope.triton._rope_kernel` computes it
    (rotation by ``-sin``: ``g1 = d1 * c - d2 * (-s)``, ``g2 = d2 * c + d1 * (-s)``, each product
    rounded, then the add) rounded to BF16, the rope op's output gradient the separate norm
    backward would read."""
    dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
    if ROPE:
        first = cols < half
        j = tl.where(first, cols, cols - half)
        partner = tl.load(dy_row + tl.where(first, cols + half, cols - half), mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos_row + j, mask=mask, other=0.0)
        ns = -tl.load(sin_row + j, mask=mask, other=0.0)
        dy = tl.where(first, dy * c - partner * ns, dy * c + partner * ns).to(tl.bfloat16).to(tl.float32)
    return dy


@triton.jit
def _row_dx(x_row, dy_row, w_ptr, x, dy, w, rstd, n_cols, n_float, cos_row, sin_row, half,
            LANES: tl.constexpr, CHUNKS: tl.constexpr, ROPE: tl.constexpr):
    """FP32 dx of one row (``x``, ``dy``, ``w`` the row's FP32 values, ``x_row`` / ``dy_row`` its
    pointers): ``k = (sum(dy * w * x) / E) * r^2`` in the forward's fixed lane order, then
    ``dx = r * (dy * w - x * k)``; ``ROPE``: ``dy`` is the rotation's backward (:func:`_load_grad`)."""
    lanes = tl.zeros((LANES,), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):  # the forward's fixed order, over g * x
        lc = c * LANES + tl.arange(0, LANES)
        lm = lc < n_cols
        xc = tl.load(x_row + lc, mask=lm, other=0.0).to(tl.float32)
        dyc = _load_grad(dy_row, lc, lm, cos_row, sin_row, half, ROPE)
        wc = tl.load(w_ptr + lc, mask=lm, other=0.0).to(tl.float32)
        lanes += (dyc * wc) * xc
    k = tl.math.div_rn(row_sum_fixed(lanes, LANES), n_float) * (rstd * rstd)
    g = dy * w
    return rstd * (g - x * k)


@triton.jit
def _with_residual_grad(dx, res_ptr, cols, mask, RES: tl.constexpr):
    """``RES``: the norm's dx rounded to BF16, plus the residual stream's gradient ``res`` (BF16),
    in FP32, rounded by the caller's store: autograd's accumulation of the two gradients of the
    residual sum ``s`` (``bf16(bf16(dx) + res)``, commutative), so the fused add + norm backward
    gives the separate ops' bits. Without ``RES``: ``dx`` as it is."""
    if RES:
        dx = dx.to(tl.bfloat16).to(tl.float32) + tl.load(res_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return dx


@triton.jit
def _rms_bwd_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, part_ptr, res_ptr, cos_ptr, sin_ptr, n_rows, n_cols,
                    n_heads, n_float, stride_xt, stride_xh, stride_dyt, stride_dyh, stride_dxt, stride_dxh, stride_rt,
                    stride_ct, stride_st, BLOCK: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr,
                    CHUNKS: tl.constexpr, RES: tl.constexpr, ROPE: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    part = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(ROWS):
        r = pid * ROWS + i
        live = (tl.zeros((BLOCK,), dtype=tl.int32) + r) < n_rows  # block-shaped row mask
        rr = tl.minimum(r, n_rows - 1)  # rows past the end re-read the last row; nothing is kept
        t = (rr // n_heads).to(tl.int64)
        h = (rr % n_heads).to(tl.int64)
        x = tl.load(x_ptr + t * stride_xt + h * stride_xh + cols, mask=mask, other=0.0).to(tl.float32)
        dy = _load_grad(dy_ptr + t * stride_dyt + h * stride_dyh, cols, mask, cos_ptr + t * stride_ct,
                        sin_ptr + t * stride_st, n_cols // 2, ROPE)
        rstd = tl.load(rstd_ptr + rr)
        dx = _row_dx(x_ptr + t * stride_xt + h * stride_xh, dy_ptr + t * stride_dyt + h * stride_dyh, w_ptr,
                     x, dy, w, rstd, n_cols, n_float, cos_ptr + t * stride_ct, sin_ptr + t * stride_st, n_cols // 2,
                     LANES, CHUNKS, ROPE)
        dx = _with_residual_grad(dx, res_ptr + t * stride_rt, cols, mask, RES)
        tl.store(dx_ptr + t * stride_dxt + h * stride_dxh + cols, dx.to(tl.bfloat16), mask=mask & live)
        part += tl.where(live, dy * (x * rstd), 0.0)
    tl.store(part_ptr + pid.to(tl.int64) * n_cols + cols, part, mask=mask)


@triton.jit
def _rms_bwd_dx_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, res_ptr, cos_ptr, sin_ptr, n_cols, n_heads, n_float,
                       stride_xt, stride_xh, stride_dyt, stride_dyh, stride_dxt, stride_dxh, stride_rt,
                       stride_ct, stride_st, BLOCK: tl.constexpr, LANES: tl.constexpr, CHUNKS: tl.constexpr,
                       RES: tl.constexpr, ROPE: tl.constexpr):
    """dx of one row, the arithmetic of :func:`_rms_bwd_kernel`'s row loop (the split form)."""
    r = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    t = (r // n_heads).to(tl.int64)
    h = (r % n_heads).to(tl.int64)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + cols, mask=mask, other=0.0).to(tl.float32)
    dy = _load_grad(dy_ptr + t * stride_dyt + h * stride_dyh, cols, mask, cos_ptr + t * stride_ct,
                    sin_ptr + t * stride_st, n_cols // 2, ROPE)
    rstd = tl.load(rstd_ptr + r)
    dx = _row_dx(x_ptr + t * stride_xt + h * stride_xh, dy_ptr + t * stride_dyt + h * stride_dyh, w_ptr,
                 x, dy, w, rstd, n_cols, n_float, cos_ptr + t * stride_ct, sin_ptr + t * stride_st, n_cols // 2,
                 LANES, CHUNKS, ROPE)
    dx = _with_residual_grad(dx, res_ptr + t * stride_rt, cols, mask, RES)
    tl.store(dx_ptr + t * stride_dxt + h * stride_dxh + cols, dx.to(tl.bfloat16), mask=mask)


@triton.jit
def _rms_bwd_dw_kernel(x_ptr, dy_ptr, rstd_ptr, part_ptr, cos_ptr, sin_ptr, n_rows, n_cols, n_heads,
                       stride_xt, stride_xh, stride_dyt, stride_dyh, stride_ct, stride_st,
                       BLOCK: tl.constexpr, ROWS: tl.constexpr, ROPE: tl.constexpr, UNROLL: tl.constexpr):
    """Stage 1 of dweight in the split form: program ``(chunk, column block)`` adds
    ``dy * (x * r)`` over the chunk's ``ROWS`` rows in order, the partial :func:`_rms_bwd_kernel`
    writes for those columns (same products, same order). The row loop is unrolled ``UNROLL``
    rows deep (``tl.static_range``; ``ROWS`` a multiple of it): the same adds in the same order,
    with the step's loads free to be issued before its adds."""
    tl.static_assert(ROWS % UNROLL == 0, "UNROLL must divide ROWS (else a chunk would add its neighbour's rows)")
    pid = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    part = tl.zeros((BLOCK,), dtype=tl.float32)
    for i0 in range(0, ROWS, UNROLL):
        for j in tl.static_range(UNROLL):
            r = pid * ROWS + i0 + j
            live = (tl.zeros((BLOCK,), dtype=tl.int32) + r) < n_rows
            rr = tl.minimum(r, n_rows - 1)
            t = (rr // n_heads).to(tl.int64)
            h = (rr % n_heads).to(tl.int64)
            x = tl.load(x_ptr + t * stride_xt + h * stride_xh + cols, mask=mask, other=0.0).to(tl.float32)
            dy = _load_grad(dy_ptr + t * stride_dyt + h * stride_dyh, cols, mask, cos_ptr + t * stride_ct,
                            sin_ptr + t * stride_st, n_cols // 2, ROPE)
            rstd = tl.load(rstd_ptr + rr)
            part += tl.where(live, dy * (x * rstd), 0.0)
    tl.store(part_ptr + pid.to(tl.int64) * n_cols + cols, part, mask=mask)


@triton.jit
def _rms_bwd_dx_rows_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, cos_ptr, sin_ptr, n_rows, n_cols, n_heads,
                            n_float, stride_xt, stride_xh, stride_dyt, stride_dyh, stride_dxt, stride_dxh,
                            stride_ct, stride_st, BLOCK: tl.constexpr, LANES: tl.constexpr, CHUNKS: tl.constexpr,
                            R: tl.constexpr, ROPE: tl.constexpr):
    """dx of ``R`` rows per program as one ``[R, BLOCK]`` tile (narrow rows,
    :data:`ROWS_FORM_MAX_BLOCK`): per row the arithmetic of :func:`_row_dx` (the lane sums in the
    forward's fixed order, :func:`row_sum_fixed_rows`), no residual gradient."""
    r = tl.program_id(0) * R + tl.arange(0, R)
    live = r < n_rows
    rr = tl.minimum(r, n_rows - 1)  # rows past the end re-read the last row; nothing is stored
    t = (rr // n_heads).to(tl.int64)
    h = (rr % n_heads).to(tl.int64)
    x_row = (x_ptr + t * stride_xt + h * stride_xh)[:, None]
    dy_row = (dy_ptr + t * stride_dyt + h * stride_dyh)[:, None]
    cos_row = (cos_ptr + t * stride_ct)[:, None]
    sin_row = (sin_ptr + t * stride_st)[:, None]
    half = n_cols // 2
    cols = tl.arange(0, BLOCK)[None, :]
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    dy = _load_grad(dy_row, cols, mask, cos_row, sin_row, half, ROPE)
    rstd = tl.load(rstd_ptr + rr)
    lanes = tl.zeros((R, LANES), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):  # the forward's fixed order, over g * x
        lc = c * LANES + tl.arange(0, LANES)[None, :]
        lm = lc < n_cols
        xc = tl.load(x_row + lc, mask=lm, other=0.0).to(tl.float32)
        dyc = _load_grad(dy_row, lc, lm, cos_row, sin_row, half, ROPE)
        wc = tl.load(w_ptr + lc, mask=lm, other=0.0).to(tl.float32)
        lanes += (dyc * wc) * xc
    k = tl.math.div_rn(row_sum_fixed_rows(lanes, R, LANES), n_float) * (rstd * rstd)
    dx = rstd[:, None] * (dy * w - x * k[:, None])
    out = (dx_ptr + t * stride_dxt + h * stride_dxh)[:, None]
    tl.store(out + cols, dx.to(tl.bfloat16), mask=mask & live[:, None])


@triton.jit
def _dw_reduce_kernel(part_ptr, dw_ptr, n_parts, n_cols, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """dweight stage 2: each column's partial rows added in FP32 in increasing row order, one
    rounding to BF16. The loop body is unrolled ``UNROLL`` rows deep (``tl.static_range``: the
    same adds in the same order) so the compiler can issue those rows' loads before their adds:
    for the qk-norm weights one program walks thousands of partial rows, and one load in flight
    at a time left it latency-bound."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    n_main = (n_parts // UNROLL) * UNROLL
    for p0 in range(0, n_main, UNROLL):
        for i in tl.static_range(UNROLL):
            acc += tl.load(part_ptr + (p0 + i) * n_cols + cols, mask=mask, other=0.0)
    for p in range(n_main, n_parts):
        acc += tl.load(part_ptr + p * n_cols + cols, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, acc.to(tl.bfloat16), mask=mask)


@triton.jit
def _norm_rope_row(base, w_ptr, cos_row, sin_row, eps, n_float, D: tl.constexpr, HALF: tl.constexpr,
                   HF_ORDER: tl.constexpr, LANES: tl.constexpr, CHUNKS: tl.constexpr):
    """One head row [D]: the norm's BF16 output, rotated; returns the two rotated halves in BF16
    and the row's FP32 ``rstd`` (the forward's steps of :func:`_rms_fwd_kernel` on one row of D,
    then :func:`rl_engine.ops.rope.triton._rope_kernel`'s rotation of its BF16 output), for the
    decode launch :func:`rl_engine.chain.fused.qk_norm_rope`; the training kernel runs the same
    steps on row tiles (:func:`_norm_rope_rows_kernel`)."""
    cols = tl.arange(0, HALF)
    lanes = tl.zeros((LANES,), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):  # lane i adds columns i, i + LANES, ... in order
        lc = c * LANES + tl.arange(0, LANES)
        xc = tl.load(base + lc, mask=lc < D, other=0.0).to(tl.float32)
        lanes += xc * xc
    ss = row_sum_fixed(lanes, LANES)
    rstd = tl.math.div_rn(tl.full((), 1.0, tl.float32), tl.math.sqrt_rn(tl.math.div_rn(ss, n_float) + eps))
    o1, o2 = _weigh_rotate(tl.load(base + cols).to(tl.float32) * rstd,
                           tl.load(base + HALF + cols).to(tl.float32) * rstd, w_ptr, cols, HALF,
                           tl.load(cos_row + cols), tl.load(sin_row + cols), HF_ORDER)
    return o1, o2, rstd


@triton.jit
def _weigh_rotate(x1, x2, w_ptr, cols, HALF: tl.constexpr, cs, sn, HF_ORDER: tl.constexpr):
    """The norm's BF16 output from the normalised halves ``x1``, ``x2`` (FP32 ``x * rstd``, any
    shape ending in the half's columns ``cols``) and the weight halves, in the norm's rounding order,
    then RoPE's rotation of it by ``cs``, ``sn`` (each product rounded, then the add); returns the two
    rotated halves in BF16. Shared by the one-row and the row-tile forms."""
    w1 = tl.load(w_ptr + cols).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + cols).to(tl.float32)
    if HF_ORDER:
        y1 = (x1.to(tl.bfloat16).to(tl.float32) * w1).to(tl.bfloat16).to(tl.float32)
        y2 = (x2.to(tl.bfloat16).to(tl.float32) * w2).to(tl.bfloat16).to(tl.float32)
    else:
        y1 = (x1 * w1).to(tl.bfloat16).to(tl.float32)
        y2 = (x2 * w2).to(tl.bfloat16).to(tl.float32)
    return (y1 * cs - y2 * sn).to(tl.bfloat16), (y2 * cs + y1 * sn).to(tl.bfloat16)


@triton.jit
def _norm_rope_rows_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, rstd_ptr, n_rows, n_heads, eps, n_float,
                           s_xt, s_xh, s_ct, s_st, s_yt, s_yh, D: tl.constexpr, HALF: tl.constexpr,
                           HF_ORDER: tl.constexpr, LANES: tl.constexpr, CHUNKS: tl.constexpr, R: tl.constexpr):
    """``R`` head rows per program (row ``r = t * n_heads + h``) as one ``[R, HALF]`` tile per half:
    each normalised and rotated with :func:`_norm_rope_row`'s steps (the lane sums by
    :func:`row_sum_fixed_rows`), its ``rstd`` kept for the backward."""
    r = tl.program_id(0) * R + tl.arange(0, R)
    live = r < n_rows
    rr = tl.minimum(r, n_rows - 1)  # rows past the end re-read the last row; nothing is stored
    t = (rr // n_heads).to(tl.int64)
    h = (rr % n_heads).to(tl.int64)
    base = (x_ptr + t * s_xt + h * s_xh)[:, None]
    lanes = tl.zeros((R, LANES), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):  # lane i adds columns i, i + LANES, ... in order
        lc = c * LANES + tl.arange(0, LANES)[None, :]
        xc = tl.load(base + lc, mask=lc < D, other=0.0).to(tl.float32)
        lanes += xc * xc
    ss = row_sum_fixed_rows(lanes, R, LANES)
    rstd = tl.math.div_rn(tl.full((R,), 1.0, tl.float32), tl.math.sqrt_rn(tl.math.div_rn(ss, n_float) + eps))
    cols = tl.arange(0, HALF)[None, :]
    o1, o2 = _weigh_rotate(tl.load(base + cols).to(tl.float32) * rstd[:, None],
                           tl.load(base + HALF + cols).to(tl.float32) * rstd[:, None], w_ptr, cols, HALF,
                           tl.load((cos_ptr + t * s_ct)[:, None] + cols), tl.load((sin_ptr + t * s_st)[:, None] + cols),
                           HF_ORDER)
    out = (y_ptr + t * s_yt + h * s_yh)[:, None]
    keep = live[:, None]
    tl.store(out + cols, o1, mask=keep)
    tl.store(out + HALF + cols, o2, mask=keep)
    tl.store(rstd_ptr + r, rstd, mask=live)


@triton.jit
def _rms_fwd_split_control_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, n_heads, eps,
                                  stride_xt, stride_xh, stride_yt, stride_yh,
                                  PART: tl.constexpr, SPLIT: tl.constexpr, HF_ORDER: tl.constexpr):
    """NEGATIVE CONTROL ONLY (never used by rl_engine): mean(x^2) split into SPLIT parts whose
    partial sums are rounded to BF16 before they are added, as a naive split reduction would."""
    r = tl.program_id(0)
    t = (r // n_heads).to(tl.int64)
    h = (r % n_heads).to(tl.int64)
    base = x_ptr + t * stride_xt + h * stride_xh
    sq = 0.0
    for k in tl.static_range(SPLIT):
        cols = k * PART + tl.arange(0, PART)
        xk = tl.load(base + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        part = tl.sum(xk * xk, axis=0)
        if SPLIT > 1:
            part = part.to(tl.bfloat16).to(tl.float32)
        sq += part
    rstd = tl.rsqrt(sq / n_cols + eps)
    for k in tl.static_range(SPLIT):
        cols = k * PART + tl.arange(0, PART)
        mask = cols < n_cols
        x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        normed = x * rstd
        if HF_ORDER:
            y = normed.to(tl.bfloat16).to(tl.float32) * w
        else:
            y = normed * w
        tl.store(y_ptr + t * stride_yt + h * stride_yh + cols, y.to(tl.bfloat16), mask=mask)
    tl.store(rstd_ptr + r, rstd)


def _rows_view(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(T, H, E, stride_t, stride_h) of a [T, E] (H = 1) or [T, H, E] tensor."""
    if x.dim() == 2:
        return x.shape[0], 1, x.shape[1], x.stride(0), 0
    return x.shape[0], x.shape[1], x.shape[2], x.stride(0), x.stride(1)


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, hf: bool,
                 split: int = 0, num_warps: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward on validated rows ([T, E] or [T, H, D]); returns (y like x in BF16,
    rstd [rows] FP32). ``split`` > 0 only for the negative control (BF16-rounded partial sums).
    ``num_warps`` (0: the module's choice from E) is a launch setting for the sweep tool; every
    step sums an axis of size 2, so the bits do not depend on it (tested on the GPU)."""
    t, h, e, sxt, sxh = _rows_view(x)
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    n_rows = t * h
    rstd = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    if n_rows and e:
        _, _, _, syt, syh = _rows_view(y)
        block = _block(e)
        if split:
            part = next_power_of_2(cdiv(e, split))
            _rms_fwd_split_control_kernel[(n_rows,)](
                x, weight, y, rstd, e, h, eps, sxt, sxh, syt, syh,
                PART=part, SPLIT=cdiv(e, part), HF_ORDER=hf, num_warps=_warps(block),
                enable_fp_fusion=FP_FUSION,
            )
        else:
            _rms_fwd_kernel[(n_rows,)](
                x, weight, y, rstd, x, y, e, h, eps, float(e), sxt, sxh, syt, syh, 0, 0,
                BLOCK=block, HF_ORDER=hf, LANES=LANES, CHUNKS=cdiv(e, LANES),
                num_warps=num_warps or _warps(block), ADD=False, enable_fp_fusion=FP_FUSION,
            )
    return y, rstd


def add_rms_norm_train_fwd(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                           hf: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`add_rms_norm_fwd` for training: ``(s, y, rstd)``, the same kernel keeping the FP32
    ``rstd`` [T] of each row for the backward (:func:`rms_norm_bwd` with ``residual_grad``)."""
    return _add_rms_norm(x, delta, weight, eps, hf, _warps(_block(x.shape[1])))


FUSED_NORM_ROPE = True
"""This backend has the fused QK-norm + RoPE for training (:func:`norm_rope_train_fwd`,
:func:`rms_norm_bwd` with ``rope``)."""
def norm_rope_train_fwd(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                        hf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """QK-norm then RoPE of validated [T, H, D] rows in one launch (D/2 a power of two, cos / sin
    FP32 [T, D/2] with unit stride on the last axis): ``(y [T, H, D] BF16, rstd [T * H]
    FP32)``, bitwise ``rope(qk_norm(x))`` of the separate launches (the norm's BF16 output is
    rotated) and the norm's ``rstd``."""
    t, h, d = x.shape
    y = torch.empty((t, h, d), dtype=torch.bfloat16, device=x.device)
    rstd = torch.empty((t * h,), dtype=torch.float32, device=x.device)
    if t and h and d:
        rows = rows_per_program(d)
        _norm_rope_rows_kernel[(cdiv(t * h, rows),)](
            x, weight, cos, sin, y, rstd, t * h, h, eps, float(d), x.stride(0), x.stride(1), cos.stride(0),
            sin.stride(0), y.stride(0), y.stride(1), D=d, HALF=d // 2, HF_ORDER=hf, LANES=LANES,
            CHUNKS=cdiv(d, LANES), R=rows, num_warps=4, enable_fp_fusion=FP_FUSION,
        )
    return y, rstd


def _add_rms_norm(x, delta, weight, eps, hf, num_warps):
    t, e = x.shape
    s = torch.empty((t, e), dtype=torch.bfloat16, device=x.device)
    y = torch.empty((t, e), dtype=torch.bfloat16, device=x.device)
    rstd = torch.empty((t,), dtype=torch.float32, device=x.device)
    if t and e:
        block = _block(e)
        _rms_fwd_kernel[(t,)](
            x, weight, y, rstd, delta, s, e, 1, eps, float(e), x.stride(0), 0, y.stride(0), 0,
            delta.stride(0), s.stride(0),
            BLOCK=block, HF_ORDER=hf, LANES=LANES, CHUNKS=cdiv(e, LANES), num_warps=num_warps, ADD=True,
            enable_fp_fusion=FP_FUSION,
        )
    return s, y, rstd


def add_rms_norm_fwd(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                     hf: bool, num_warps: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next norm in one launch (a decode step's ``x + o_proj(...)`` then
    ``post_attention_layernorm``): returns ``(s, y)``, ``s = x + delta`` [T, E] BF16 (FP32 add,
    rounded once, as ``torch.add`` on BF16) and ``y = rms_norm(s)`` [T, E] BF16, bitwise the two
    separate launches (tested). x, delta [T, E] BF16 with unit stride on the last axis, weight [E];
    validated by the caller (:func:`rl_engine.chain.fused.add_rms_norm`). No rstd is kept (no
    backward: the rollout step only). ``num_warps`` as in :func:`rms_norm_fwd` (0: ``ADD_WARPS``)."""
    block = _block(x.shape[1])
    s, y, _ = _add_rms_norm(x, delta, weight, eps, hf, num_warps or (ADD_WARPS if block <= 4096 else _warps(block)))
    return s, y


def dw_reduce(parts: torch.Tensor, dw: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """dweight stage 2: ``dw [E]`` BF16 = the FP32 partial rows ``parts [P, E]`` of each column added
    in increasing row order, rounded once (:func:`_dw_reduce_kernel`). ``block``: columns per
    program (None: :data:`REDUCE_BLOCK`), a power of two; a launch setting, tested bit for bit.
    Raises ValueError for another block."""
    n_parts, e = parts.shape
    block = REDUCE_BLOCK if block is None else block
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    _dw_reduce_kernel[(cdiv(e, block),)](parts, dw, n_parts, e, BLOCK=block, UNROLL=REDUCE_UNROLL,
                                         num_warps=reduce_warps(block), enable_fp_fusion=FP_FUSION)
    return dw


def reduce_warps(block: int) -> int:
    """Warps of a stage-2 program of ``block`` columns: one per 32 columns, 1 to 4."""
    return max(1, min(4, block // 32))


def rms_norm_bwd(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor, need_dx: bool,
                 need_dw: bool, split: bool | None = None, residual_grad: torch.Tensor | None = None,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                 rows: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward (dy BF16 with unit stride on the last axis); returns (dx like x,
    dweight [E]), both BF16. The fused form computes both in one kernel; the split form (``split``,
    None: :data:`SPLIT_BELOW_PROGRAMS`) runs only the kernels of what is needed and leaves the
    other output unwritten (its caller drops it); the rows form (``rows``, None: rows of at most
    :data:`ROWS_FORM_MAX_BLOCK` padded columns, no ``residual_grad``, ``split`` not forced) is the
    split form with dx computed for several rows per program. Every form gives the same bits.
    ``residual_grad`` ([T, E] BF16, unit stride on E; [T, E] rows only): added to the BF16 dx in
    FP32 and rounded once (the add + norm backward,
    :func:`_with_residual_grad`). ``rope`` = (cos, sin) [T, D/2] FP32 (unit stride on the last
    axis; [T, H, D] rows only): ``dy`` is the gradient of the norm's output rotated by RoPE, and
    each load of it takes the rotation's backward first (the fused QK-norm + RoPE backward,
    :func:`_load_grad`)."""
    t, h, e, sxt, sxh = _rows_view(x)
    check_fused_bwd_args(x, residual_grad, rope)
    cos, sin = rope if rope is not None else (dy, dy)
    sct, sst = (cos.stride(0), sin.stride(0)) if rope is not None else (0, 0)
    rp = rope is not None
    res = residual_grad is not None
    res_t, srt = (residual_grad, residual_grad.stride(0)) if res else (dy, 0)
    if rows and res:
        raise ValueError("rms_norm_bwd: the rows form takes no residual_grad")
    if rows and split is False:
        raise ValueError("rms_norm_bwd: rows=True and split=False ask for two different forms")
    _, _, _, sdyt, sdyh = _rows_view(dy)
    dx = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    dw = torch.empty((e,), dtype=torch.bfloat16, device=x.device)
    n_rows = t * h
    if e == 0:
        return dx, dw
    if n_rows == 0:
        dw.zero_()
        return dx, dw
    _, _, _, sdxt, sdxh = _rows_view(dx)
    n_parts = cdiv(n_rows, ROWS_PER_PROGRAM)
    parts = torch.empty((n_parts, e), dtype=torch.float32, device=x.device)
    block = _block(e)
    if rows is None:
        rows = split is None and block <= ROWS_FORM_MAX_BLOCK and not res
    if split is None:
        split = n_parts < SPLIT_BELOW_PROGRAMS
    if split or rows:
        if need_dx and rows:
            r = rows_per_program(block)
            _rms_bwd_dx_rows_kernel[(cdiv(n_rows, r),)](
                x, weight, dy, rstd, dx, cos, sin, n_rows, e, h, float(e), sxt, sxh, sdyt, sdyh, sdxt, sdxh,
                sct, sst, BLOCK=block, LANES=LANES, CHUNKS=cdiv(e, LANES), R=r, ROPE=rp, num_warps=4,
                enable_fp_fusion=FP_FUSION,
            )
        elif need_dx:
            _rms_bwd_dx_kernel[(n_rows,)](
                x, weight, dy, rstd, dx, res_t, cos, sin, e, h, float(e), sxt, sxh, sdyt, sdyh, sdxt, sdxh, srt,
                sct, sst, BLOCK=block, LANES=LANES, CHUNKS=cdiv(e, LANES), num_warps=_warps(block), RES=res,
                ROPE=rp, enable_fp_fusion=FP_FUSION,
            )
        if need_dw:
            dw_block = min(DW_BLOCK, block)
            _rms_bwd_dw_kernel[(n_parts, cdiv(e, dw_block))](
                x, dy, rstd, parts, cos, sin, n_rows, e, h, sxt, sxh, sdyt, sdyh, sct, sst,
                BLOCK=dw_block, ROWS=ROWS_PER_PROGRAM, ROPE=rp, UNROLL=DW_UNROLL, num_warps=2,
                enable_fp_fusion=FP_FUSION,
            )
            dw_reduce(parts, dw)
        return dx, dw
    _rms_bwd_kernel[(n_parts,)](
        x, weight, dy, rstd, dx, parts, res_t, cos, sin, n_rows, e, h, float(e), sxt, sxh, sdyt, sdyh, sdxt, sdxh,
        srt, sct, sst, BLOCK=block, ROWS=ROWS_PER_PROGRAM, LANES=LANES, CHUNKS=cdiv(e, LANES),
        num_warps=_warps(block), RES=res, ROPE=rp, enable_fp_fusion=FP_FUSION,
    )
    dw_reduce(parts, dw)
    return dx, dw
