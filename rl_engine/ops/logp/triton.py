"""Triton log-probabilities of target tokens from FP32 logits, forward and backward.

Forward: one program per row. The V axis is visited in fixed tiles of ``BLOCK_V`` entries (a module
constant, never derived from T) in increasing order, with an online max and sum-exp in FP32
(Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"). Tail lanes beyond V load
``-inf`` and contribute exactly 0 to the sum. The result is ``(z_t - m) - log(s)`` with
``z = logits / temperature``, ``m`` the row max of ``z`` and ``s = sum(exp(z - m))``, all FP32
(``docs/pitfalls.md`` P4, P11). The row max ``m`` and ``log(s)`` are saved for backward (together they are the
FP32 log-sum-exp ``lse = m + log(s)``; keeping the two parts avoids rounding ``lse`` at large logit
scales).

Backward: ``dlogits = (g * onehot(target) - g * softmax(z)) / temperature`` in FP32, one program
per (row, V tile); every element depends only on its own row.

A row's bits depend only on that row (its logits, target and the temperature): batch invariance
holds by construction. The same kernels serve ``batch_invariant_logp`` through a two-level row
index ``[O, I]`` with strides and an optional row mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, divide
from rl_engine.ops.logp import declared

BLOCK_V = 4096
"""Width of the V tiles of the online log-sum-exp (fixed; never derived from T)."""
NUM_WARPS = 8
"""Warps per program of every logp kernel (fixed)."""


# --------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _tile_sum_declared(e):
    """Sum of one 4096-column tile ``e`` in the declared order (``declared.DECLARED_LSE``): a
    pairwise tree over column bits 8, 9, 10, 11, then bits 4, 3, 2, 1, 0, then 7, 6, 5 (the order in
    which Triton 3.9 sums a tile laid out as 16 values per thread, 32 lanes, 8 warps; the CUDA
    kernel ``lpd_fwd_kernel`` sums the same way). Every step sums an axis of size 2, one IEEE
    addition, so no compiler or layout can reorder it."""
    tl.static_assert(e.shape[0] == 4096, "the declared tile sum is declared for 4096 columns")
    x = tl.reshape(e, (16, 256))
    x = tl.sum(tl.reshape(x, (8, 2, 256)), axis=1)  # bit 8
    x = tl.sum(tl.reshape(x, (4, 2, 256)), axis=1)  # bit 9
    x = tl.sum(tl.reshape(x, (2, 2, 256)), axis=1)  # bit 10
    x = tl.sum(tl.reshape(x, (1, 2, 256)), axis=1)  # bit 11
    x = tl.reshape(x, (8, 32))
    x = tl.sum(tl.reshape(x, (8, 2, 16)), axis=1)  # bit 4
    x = tl.sum(tl.reshape(x, (8, 2, 8)), axis=1)  # bit 3
    x = tl.sum(tl.reshape(x, (8, 2, 4)), axis=1)  # bit 2
    x = tl.sum(tl.reshape(x, (8, 2, 2)), axis=1)  # bit 1
    x = tl.sum(tl.reshape(x, (8, 2, 1)), axis=1)  # bit 0
    x = tl.reshape(x, (8,))
    x = tl.sum(tl.reshape(x, (2, 4)), axis=0)  # bit 7
    x = tl.sum(tl.reshape(x, (2, 2)), axis=0)  # bit 6
    return tl.sum(x, axis=0)  # bit 5


@triton.jit
def _row_logprob(x_row, tgt, n_cols, temperature, BLOCK_V: tl.constexpr, DECLARED: tl.constexpr):
    """Online FP32 log-softmax of one row; returns (logprob of tgt, row max m, log(sum exp(z - m))).
    ``DECLARED``: the tile sum and division of the declared sequence (``declared.DECLARED_LSE``)."""
    offs = tl.arange(0, BLOCK_V)
    run_max = float("-inf")
    run_sum = 0.0
    # Contiguity pinned to 1: the compiler must not pick a wider per-thread layout when it can
    # prove 16-byte alignment (a row stride divisible by 16, an aligned base pointer), because
    # the layout decides the order of the tl.sum below; one layout for every stride and base
    # pointer keeps a row's bits independent of the memory layout (seen on H200: a row stride
    # of 1008 vs 1000 changed the sum-exp bits without this hint).
    cols = tl.max_contiguous(offs, 1)
    x_next = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf"))
    for start in range(0, n_cols, BLOCK_V):
        # The next tile's load is issued before this tile's reductions (a single row at decode is
        # otherwise one load latency per tile, 37 tiles at V = 151936); the same loads, layout
        # and arithmetic as loading each tile in its own iteration.
        x = x_next
        cols = tl.max_contiguous(start + BLOCK_V + offs, 1)
        x_next = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf"))
        z = divide(x, temperature, DECLARED)
        new_max = tl.maximum(run_max, tl.max(z, axis=0))
        # A row that is -inf so far keeps a finite reference (exp(-inf - 0) = 0, no NaN).
        ref = tl.where(new_max == float("-inf"), 0.0, new_max)
        if DECLARED:
            run_sum = run_sum * tl.exp(run_max - ref) + _tile_sum_declared(tl.exp(z - ref))
        else:
            run_sum = run_sum * tl.exp(run_max - ref) + tl.sum(tl.exp(z - ref), axis=0)
        run_max = new_max
    log_sum = tl.log(run_sum)
    z_t = divide(tl.load(x_row + tgt), temperature, DECLARED)
    return (z_t - run_max) - log_sum, run_max, log_sum


@triton.jit
def _logp_fwd_kernel(
    x_ptr, tgt_ptr, mask_ptr, out_ptr, rmax_ptr, rlog_ptr,
    n_inner, n_cols,
    stride_xo, stride_xi, stride_to, stride_ti, stride_mo, stride_mi,
    temperature,
    HAS_MASK: tl.constexpr, BLOCK_V: tl.constexpr, DECLARED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    outer = row // n_inner
    inner = row % n_inner
    x_row = x_ptr + outer * stride_xo + inner * stride_xi
    if HAS_MASK:
        keep = tl.load(mask_ptr + outer * stride_mo + inner * stride_mi)
        if keep != 0:
            tgt = tl.load(tgt_ptr + outer * stride_to + inner * stride_ti)
            lp, m, ls = _row_logprob(x_row, tgt, n_cols, temperature, BLOCK_V, DECLARED)
            tl.store(out_ptr + row, lp)
            tl.store(rmax_ptr + row, m)
            tl.store(rlog_ptr + row, ls)
        else:
            tl.store(out_ptr + row, 0.0)
            tl.store(rmax_ptr + row, 0.0)
            tl.store(rlog_ptr + row, 0.0)
    else:
        tgt = tl.load(tgt_ptr + outer * stride_to + inner * stride_ti)
        lp, m, ls = _row_logprob(x_row, tgt, n_cols, temperature, BLOCK_V, DECLARED)
        tl.store(out_ptr + row, lp)
        tl.store(rmax_ptr + row, m)
        tl.store(rlog_ptr + row, ls)


@triton.jit
def _row_grad(x_row, dx_row, tgt, g, m, ls, cols, n_cols, temperature, DECLARED: tl.constexpr):
    inb = cols < n_cols
    x = tl.load(x_row + cols, mask=inb, other=0.0)
    z = divide(x, temperature, DECLARED)
    p = tl.exp((z - m) - ls)
    dx = divide(tl.where(cols == tgt, g, 0.0) - p * g, temperature, DECLARED)
    tl.store(dx_row + cols, dx, mask=inb)


@triton.jit
def _logp_bwd_kernel(
    x_ptr, tgt_ptr, mask_ptr, g_ptr, rmax_ptr, rlog_ptr, dx_ptr,
    n_inner, n_cols,
    stride_xo, stride_xi, stride_to, stride_ti, stride_mo, stride_mi, stride_do, stride_di,
    temperature,
    HAS_MASK: tl.constexpr, BLOCK_V: tl.constexpr, DECLARED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    outer = row // n_inner
    inner = row % n_inner
    x_row = x_ptr + outer * stride_xo + inner * stride_xi
    dx_row = dx_ptr + outer * stride_do + inner * stride_di
    if HAS_MASK:
        keep = tl.load(mask_ptr + outer * stride_mo + inner * stride_mi)
        if keep != 0:
            tgt = tl.load(tgt_ptr + outer * stride_to + inner * stride_ti)
            g = tl.load(g_ptr + row)
            m = tl.load(rmax_ptr + row)
            ls = tl.load(rlog_ptr + row)
            _row_grad(x_row, dx_row, tgt, g, m, ls, cols, n_cols, temperature, DECLARED)
        else:
            tl.store(dx_row + cols, tl.zeros([BLOCK_V], tl.float32), mask=cols < n_cols)
    else:
        tgt = tl.load(tgt_ptr + outer * stride_to + inner * stride_ti)
        g = tl.load(g_ptr + row)
        m = tl.load(rmax_ptr + row)
        ls = tl.load(rlog_ptr + row)
        _row_grad(x_row, dx_row, tgt, g, m, ls, cols, n_cols, temperature, DECLARED)


def _declared(block_v: int) -> bool:
    """Whether this launch runs the declared sequence (``declared.DECLARED_LSE``, read now); the
    negative control's other tile width runs Triton's own."""
    return declared.DECLARED_LSE and block_v == BLOCK_V


# --------------------------------------------------------------------------------------------------
# launchers over a two-level row index: logits [O, I, V], targets [O, I], mask [O, I] or None


def forward_rows(
    logits3: torch.Tensor,
    targets2: torch.Tensor,
    mask2: torch.Tensor | None,
    temperature: float,
    block_v: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel; returns (logprobs, row max, log sum-exp), each FP32 ``[O * I]``.

    Inputs are validated by the caller. ``block_v`` 0 is :data:`BLOCK_V`; another width only in
    the negative control ``logp_triton_size_dependent``.
    """
    block_v = block_v or BLOCK_V
    o, i, v = logits3.shape
    rows = o * i
    dev = logits3.device
    out = torch.empty(rows, dtype=torch.float32, device=dev)
    rmax = torch.empty(rows, dtype=torch.float32, device=dev)
    rlog = torch.empty(rows, dtype=torch.float32, device=dev)
    if rows:
        mask_arg = mask2.view(torch.uint8) if mask2 is not None else targets2
        smo, smi = (mask2.stride(0), mask2.stride(1)) if mask2 is not None else (0, 0)
        _logp_fwd_kernel[(rows,)](
            logits3, targets2, mask_arg, out, rmax, rlog,
            i, v,
            logits3.stride(0), logits3.stride(1), targets2.stride(0), targets2.stride(1), smo, smi,
            float(temperature),
            HAS_MASK=mask2 is not None, BLOCK_V=block_v, DECLARED=_declared(block_v), num_warps=NUM_WARPS,
            enable_fp_fusion=FP_FUSION,
        )
    return out, rmax, rlog


def backward_rows(
    logits3: torch.Tensor,
    targets2: torch.Tensor,
    mask2: torch.Tensor | None,
    g: torch.Tensor,
    rmax: torch.Tensor,
    rlog: torch.Tensor,
    temperature: float,
    block_v: int = 0,
) -> torch.Tensor:
    """Launch the backward kernel; returns dlogits FP32 ``[O, I, V]`` (contiguous)."""
    block_v = block_v or BLOCK_V
    o, i, v = logits3.shape
    rows = o * i
    dx = torch.empty((o, i, v), dtype=torch.float32, device=logits3.device)
    if rows:
        g = g.reshape(rows).to(torch.float32).contiguous()
        mask_arg = mask2.view(torch.uint8) if mask2 is not None else targets2
        smo, smi = (mask2.stride(0), mask2.stride(1)) if mask2 is not None else (0, 0)
        _logp_bwd_kernel[(rows, cdiv(v, block_v))](
            logits3, targets2, mask_arg, g, rmax, rlog, dx,
            i, v,
            logits3.stride(0), logits3.stride(1), targets2.stride(0), targets2.stride(1), smo, smi,
            dx.stride(0), dx.stride(1),
            float(temperature),
            HAS_MASK=mask2 is not None, BLOCK_V=block_v, DECLARED=_declared(block_v), num_warps=NUM_WARPS,
            enable_fp_fusion=FP_FUSION,
        )
    return dx
