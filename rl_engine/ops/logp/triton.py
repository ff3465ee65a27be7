"""Triton log-probabilities of target tokens from FP32 logits, forward and backward.

Forward: one program per row. The V axis is visited in fixed tiles of ``BLOCK_V`` entries (a module
constant, never derived from T) in increasing order, with an online max and sum-exp in FP32
(Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"). Tail lanes beyond V load
``-inf`` and contribute exactly 0 to the sum. The result is ``(z_t - m) - log(s)`` with
``z = logits / temperature``, ``m`` the row max of ``z`` and ``s = sum(exp(z - m))``, all FP32
(pitfalls P4, P11). The row max ``m`` and ``log(s)`` are saved for backward (together they are the
FP32 log-sum-exp ``lse = m + log(s)``; keeping the two parts avoids rounding ``lse`` at large logit
scales).

Backward: ``dlogits = (g * onehot(target) - g * softmax(z)) / temperature`` in FP32, one program
per (row, V tile); every element depends only on its own row.

A row's bits depend only on that row (its logits, target and the temperature): batch invariance
holds by construction. The same kernels serve ``batch_invariant_logp`` through a two-level row
index ``[O, I]`` with strides and an optional row mask.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
import triton
import triton.language as tl

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import FP_FUSION, check_triton_device
from rl_engine.ops._validate import check_index_range, check_same_device, check_tensor

BLOCK_V = 4096
"""Width of the V tiles of the online log-sum-exp (fixed; never derived from T)."""
NUM_WARPS = 8
"""Warps per program of every logp kernel (fixed)."""


# --------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _row_logprob(x_row, tgt, n_cols, temperature, BLOCK_V: tl.constexpr):
    """Online FP32 log-softmax of one row; returns (logprob of tgt, row max m, log(sum exp(z - m)))."""
    offs = tl.arange(0, BLOCK_V)
    run_max = float("-inf")
    run_sum = 0.0
    for start in range(0, n_cols, BLOCK_V):
        # Contiguity pinned to 1: the compiler must not pick a wider per-thread layout when it can
        # prove 16-byte alignment (a row stride divisible by 16, an aligned base pointer), because
        # the layout decides the order of the tl.sum below; one layout for every stride and base
        # pointer keeps a row's bits independent of the memory layout (seen on H200: a row stride
        # of 1008 vs 1000 changed the sum-exp bits without this hint).
        cols = tl.max_contiguous(start + offs, 1)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf"))
        z = x / temperature
        new_max = tl.maximum(run_max, tl.max(z, axis=0))
        # A row that is -inf so far keeps a finite reference (exp(-inf - 0) = 0, no NaN).
        ref = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - ref) + tl.sum(tl.exp(z - ref), axis=0)
        run_max = new_max
    log_sum = tl.log(run_sum)
    z_t = tl.load(x_row + tgt) / temperature
    return (z_t - run_max) - log_sum, run_max, log_sum


@triton.jit
def _logp_fwd_kernel(
    x_ptr, tgt_ptr, mask_ptr, out_ptr, rmax_ptr, rlog_ptr,
    n_inner, n_cols,
    stride_xo, stride_xi, stride_to, stride_ti, stride_mo, stride_mi,
    temperature,
    HAS_MASK: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    outer = row // n_inner
    inner = row % n_inner
    x_row = x_ptr + outer * stride_xo + inner * stride_xi
    if HAS_MASK:
        keep = tl.load(mask_ptr + outer * stride_mo + inner * stride_mi)
        if keep != 0:
            tgt = tl.load(tgt_ptr + outer * stride_to + inner * stride_ti)
            lp, m, ls = _row_logprob(x_row, tgt, n_cols, temperature, BLOCK_V)
            tl.store(out_ptr + row, lp)
            tl.store(rmax_ptr + row, m)
            tl.store(rlog_ptr + row, ls)
        else:
            tl.store(out_ptr + row, 0.0)
            tl.store(rmax_ptr + row, 0.0)
            tl.store(rlog_ptr + row, 0.0)
    else:
        tgt = tl.load(tgt_ptr + outer * stride_to + inner * stride_ti)
        lp, m, ls = _row_logprob(x_row, tgt, n_cols, temperature, BLOCK_V)
        tl.store(out_ptr + row, lp)
        tl.store(rmax_ptr + row, m)
        tl.store(rlog_ptr + row, ls)


@triton.jit
def _row_grad(x_row, dx_row, tgt, g, m, ls, cols, n_cols, temperature):
    inb = cols < n_cols
    x = tl.load(x_row + cols, mask=inb, other=0.0)
    z = x / temperature
    p = tl.exp((z - m) - ls)
    dx = (tl.where(cols == tgt, g, 0.0) - p * g) / temperature
    tl.store(dx_row + cols, dx, mask=inb)


@triton.jit
def _logp_bwd_kernel(
    x_ptr, tgt_ptr, mask_ptr, g_ptr, rmax_ptr, rlog_ptr, dx_ptr,
    n_inner, n_cols,
    stride_xo, stride_xi, stride_to, stride_ti, stride_mo, stride_mi, stride_do, stride_di,
    temperature,
    HAS_MASK: tl.constexpr, BLOCK_V: tl.constexpr,
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
            _row_grad(x_row, dx_row, tgt, g, m, ls, cols, n_cols, temperature)
        else:
            tl.store(dx_row + cols, tl.zeros([BLOCK_V], tl.float32), mask=cols < n_cols)
    else:
        tgt = tl.load(tgt_ptr + outer * stride_to + inner * stride_ti)
        g = tl.load(g_ptr + row)
        m = tl.load(rmax_ptr + row)
        ls = tl.load(rlog_ptr + row)
        _row_grad(x_row, dx_row, tgt, g, m, ls, cols, n_cols, temperature)


# --------------------------------------------------------------------------------------------------
# launchers over a two-level row index: logits [O, I, V], targets [O, I], mask [O, I] or None


def forward_rows(
    logits3: torch.Tensor,
    targets2: torch.Tensor,
    mask2: torch.Tensor | None,
    temperature: float,
    block_v: int = BLOCK_V,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel; returns (logprobs, row max, log sum-exp), each FP32 ``[O * I]``.

    Inputs are validated by the caller. ``block_v`` is :data:`BLOCK_V` except in the negative
    control :func:`logp_triton_size_dependent`.
    """
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
            HAS_MASK=mask2 is not None, BLOCK_V=block_v, num_warps=NUM_WARPS,
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
    block_v: int = BLOCK_V,
) -> torch.Tensor:
    """Launch the backward kernel; returns dlogits FP32 ``[O, I, V]`` (contiguous)."""
    o, i, v = logits3.shape
    rows = o * i
    dx = torch.empty((o, i, v), dtype=torch.float32, device=logits3.device)
    if rows:
        g = g.reshape(rows).to(torch.float32).contiguous()
        mask_arg = mask2.view(torch.uint8) if mask2 is not None else targets2
        smo, smi = (mask2.stride(0), mask2.stride(1)) if mask2 is not None else (0, 0)
        _logp_bwd_kernel[(rows, triton.cdiv(v, block_v))](
            logits3, targets2, mask_arg, g, rmax, rlog, dx,
            i, v,
            logits3.stride(0), logits3.stride(1), targets2.stride(0), targets2.stride(1), smo, smi,
            dx.stride(0), dx.stride(1),
            float(temperature),
            HAS_MASK=mask2 is not None, BLOCK_V=block_v, num_warps=NUM_WARPS,
            enable_fp_fusion=FP_FUSION,
        )
    return dx


# --------------------------------------------------------------------------------------------------
# validation shared by the logprob ops


def check_temperature(temperature: object) -> float:
    """``temperature`` is a real number, finite and > 0; returns it as a Python float.

    Raises InputError otherwise (a bool, a tensor, 0, a negative value, NaN or inf).
    """
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise InputError(f"temperature: expected a Python number, got {type(temperature).__name__}")
    value = float(temperature)
    if not math.isfinite(value) or value <= 0.0:
        raise InputError(f"temperature: expected a finite number > 0, got {value}")
    return value


def _check_logp_inputs(logits: torch.Tensor, targets: torch.Tensor, temperature: object) -> float:
    check_tensor("logits", logits, dtype=torch.float32, ndim=2, contiguous_last=True)
    t, v = logits.shape
    check_tensor("targets", targets, dtype=torch.int64, shape=(t,))
    check_same_device(logits=logits, targets=targets)
    if v < 1:
        raise InputError(f"logits: the vocabulary axis V is empty (shape {list(logits.shape)})")
    tau = check_temperature(temperature)
    check_index_range("targets", targets, v)
    return tau


# --------------------------------------------------------------------------------------------------
# autograd


class _LogpTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, block_v):
        out, rmax, rlog = forward_rows(logits.unsqueeze(0), targets.unsqueeze(0), None, temperature, block_v)
        ctx.save_for_backward(logits, targets, rmax, rlog)
        ctx.temperature = temperature
        ctx.block_v = block_v
        return out

    @staticmethod
    def backward(ctx, g):
        logits, targets, rmax, rlog = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        dx = backward_rows(logits.unsqueeze(0), targets.unsqueeze(0), None, g, rmax, rlog,
                           ctx.temperature, ctx.block_v)
        return dx[0], None, None, None


def logp_triton(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each target token. logits: [T, V] float32, targets: [T] int64 -> [T] float32.

    ``out[t] = log_softmax(logits[t] / temperature)[targets[t]]``. Everything is FP32: the logits
    are never rounded to BF16, the max and sum-exp accumulate in FP32 over fixed V tiles of
    :data:`BLOCK_V` in increasing order, and the output is FP32 (contract
    ``dtype_policy.logprob_output``, ``declared_exceptions.logits_for_scoring``; pitfalls P4, P11).
    Backward: dlogits [T, V] float32 = ``g * (onehot(target) - softmax(logits / temperature)) /
    temperature``. Entries of ``logits`` equal to ``-inf`` are allowed and contribute 0; NaN or
    ``+inf`` logits give NaN, as in ``torch.log_softmax``.

    Raises
    ------
    InputError
        logits is not 2-D float32 with unit stride on V, V is 0, targets is not int64 [T] on the
        same device, a target is outside [0, V), or temperature is not a finite number > 0.
    BackendUnavailable
        The tensors are not on a CUDA device (and the Triton interpreter is off).
    """
    tau = _check_logp_inputs(logits, targets, temperature)
    check_triton_device(logits, targets)
    return _LogpTriton.apply(logits, targets, tau, BLOCK_V)


DECODE_ROWS = 8
"""The negative control's "decode-sized batch": at most this many rows take its BF16-logits path."""


def _size_dependent_block_v(t: int) -> int:
    # The V tile picked from the row count: 4096 for one row, halved per doubling of T, at least 256.
    return max(256, BLOCK_V >> max(t - 1, 0).bit_length())


def logp_triton_size_dependent(logits: torch.Tensor, targets: torch.Tensor,
                               temperature: float = 1.0) -> torch.Tensor:
    """NEGATIVE CONTROL, never use: :func:`logp_triton` with two choices made from the row count T.

    * The V tile follows T (4096 for one row, halved per doubling of T, at least 256), so a row's
      FP32 sum-exp is grouped differently alone than inside a batch. The logprob often absorbs that
      (log() of a sum moved by one ulp rarely moves), so on its own this was seen to slip through
      the gate's check on the H200 at T = 1027.
    * Batches of at most :data:`DECODE_ROWS` rows take a "decode fast path" that rounds the logits
      to BF16 first (pitfall P5's train/inference mismatch, made size dependent), which moves
      nearly every logprob.

    The ``batch`` invariance transform must catch it. Same signature and dtypes as
    :func:`logp_triton`.
    """
    tau = _check_logp_inputs(logits, targets, temperature)
    check_triton_device(logits, targets)
    if logits.shape[0] <= DECODE_ROWS:
        logits = logits.to(torch.bfloat16).to(torch.float32)
    return _LogpTriton.apply(logits, targets, tau, _size_dependent_block_v(logits.shape[0]))
