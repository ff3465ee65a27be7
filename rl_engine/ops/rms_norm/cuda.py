"""CUDA C++ RMSNorm (``cuda_bf16`` backend), forward and backward; shared with ``qk_norm``.

Kernels in ``rl_engine/backends/cuda_src/norm.cu``. Rows are ``x[t]`` of a [T, E] input (H = 1) or
``x[t, h]`` of a [T, H, D] input, numbered ``t * H + h`` and addressed through the strides (no
copy for strided views).

Forward (``rl_rms_norm_fwd``): one block of 128 threads per row; ``sum(x^2)`` in FP32 with a fixed
order that depends only on the row length (thread ``i`` adds columns ``i, i + 128, ...`` in order,
a fixed warp butterfly, then ``(w0 + w1) + (w2 + w3)``); ``r = 1 / sqrt(sum / n + eps)`` (IEEE
square root and division); then the contract's rounding order
(``declared_exceptions.rms_norm_rounding_order``): ``"hf"`` ``bf16(w * bf16(x * r))`` (Hugging
Face Qwen3RMSNorm, the declared order) or ``"fused"`` ``bf16((x * r) * w)``. ``r`` is kept (FP32).

Backward (FP32, from ``y = w * x * r``; rounding treated as identity): ``g = dy * w``,
``dx = r * (g - x * ((sum(g * x) / n) * (r * r)))`` per row with the same fixed reduction, rounded
once (``rl_rms_norm_bwd_dx``); ``dweight = sum over rows of dy * (x * r)`` in two stages without
atomics (``rl_rms_norm_bwd_dw``): FP32 partials over fixed chunks of 64 rows in row order, then
the partials in chunk order, rounded once. Rows of at most 256 columns (the heads of
``qk_norm``) run dx in the rows form: a warp per row, its lanes playing the block's 128 threads
(four columns each per 128), the same column order per thread and the same sums, so the same bits
with a quarter of the blocks.

Training fusions (:data:`FUSED_ADD_NORM`, :data:`FUSED_NORM_ROPE`; the Triton backend's, the same
bits as the separate ops): the residual add + RMSNorm forward in one launch (the decode step's
``rl_add_rms_norm_fwd``, also keeping ``rstd``), the QK-norm + RoPE forward in one launch
(``rl_norm_rope_fwd`` in the rows form: the norm's steps, then ``rl_rope``'s rotation of its BF16
output), and their backward inside the norm's backward
kernels: ``residual_grad`` added to the BF16 dx in FP32 and rounded once, and ``rope``: every load
of dy takes the rotation's backward first (by -sin, rounded to BF16, as ``rl_rope`` computes it).
Rows longer than those kernels take (E > :data:`ADD_RMS_MAX_E`, D > :data:`NORM_ROPE_MAX_D`) run
the separate launches, with the same bits.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch, query
from rl_engine.ops.rms_norm._fused_args import check_fused_bwd_args


def _rows_view(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(T, H, n, stride_t, stride_h) of a [T, n] (H = 1) or [T, H, n] tensor."""
    if x.dim() == 2:
        return x.shape[0], 1, x.shape[1], x.stride(0), 0
    return x.shape[0], x.shape[1], x.shape[2], x.stride(0), x.stride(1)


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, hf: bool,
                 split: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward on validated rows ([T, E] or [T, H, D]); returns (y like x in BF16,
    rstd [rows] FP32). ``split`` (the Triton negative control's knob) must be 0 here."""
    if split:
        raise ValueError("the split-reduction negative control exists only for triton_cuda_bf16")
    t, h, n, sxt, sxh = _rows_view(x)
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    rows = t * h
    rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
    _, _, _, syt, syh = _rows_view(y)
    launch(x.device, "rl_rms_norm_fwd", x, weight, y, rstd, rows, max(h, 1), n, sxt, sxh, syt, syh, float(eps),
           1 if hf else 0)
    return y, rstd


def rms_norm_bwd(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor, need_dx: bool,
                 need_dw: bool, residual_grad: torch.Tensor | None = None,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Launch the backward (dy BF16 with unit stride on the last axis); returns (dx like x or
    None, dweight [E] or None), BF16, each launched only when needed. ``residual_grad`` ([T, E]
    BF16, unit stride on E; [T, E] rows only): added to the BF16 dx in FP32 and rounded once (the
    add + norm backward). ``rope`` = (cos, sin) [T, D/2] FP32 with unit stride on the last axis
    ([T, H, D] rows only): dy is the gradient of the rotated norm output, taken back by each load.

    Raises ValueError for a ``residual_grad`` or ``rope`` tables of another shape (the op layer
    checks them before it calls)."""
    t, h, n, sxt, sxh = _rows_view(x)
    _, _, _, sdyt, sdyh = _rows_view(dy)
    check_fused_bwd_args(x, residual_grad, rope)
    cos, sin = rope if rope is not None else (None, None)
    sct, sst = (cos.stride(0), sin.stride(0)) if rope is not None else (0, 0)
    srt = residual_grad.stride(0) if residual_grad is not None else 0
    rows = t * h
    dx = dw = None
    if need_dx:
        dx = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
        _, _, _, sdxt, sdxh = _rows_view(dx)
        launch(x.device, "rl_rms_norm_bwd_dx", x, weight, dy, rstd, dx, residual_grad, cos, sin, rows, max(h, 1), n,
               sxt, sxh, sdyt, sdyh, sdxt, sdxh, srt, sct, sst)
    if need_dw:
        dw = torch.empty((n,), dtype=torch.bfloat16, device=x.device)
        chunks = query("rl_rms_norm_dw_chunks", rows)
        partial = torch.empty((max(chunks, 1), n), dtype=torch.float32, device=x.device)
        launch(x.device, "rl_rms_norm_bwd_dw", x, dy, rstd, partial, dw, cos, sin, rows, max(h, 1), n, sxt, sxh,
               sdyt, sdyh, sct, sst)
    return dx, dw


ADD_RMS_MAX_E = 8192
"""The longest row of the one-launch add + RMSNorm (``ADD_RMS_MAX_N`` in ``norm.cu``: its row, delta
and weight staged in shared memory)."""

NORM_ROPE_MAX_D = 256
"""The longest head of the one-launch QK-norm + RoPE (``NORM_ROWS_MAX_N`` in ``norm.cu``)."""


def set_norm_rope_in_lane(on: int) -> int:
    """Choose how every later ``rl_norm_rope_fwd`` of this process rotates heads of 64, 128 or 256
    columns: 1 (the default), in registers (column ``c`` of a lane has its rotation partner
    ``c +- d / 2`` in the same lane, and each lane loads only its own columns' cos / sin, with x);
    0, through shared memory, as before 2026-12-07 (other head sizes always do). Returns the previous
    setting. For the tests and the timing tools: the same values, expressions and roundings, so the
    bits do not depend on it (tested).

    Raises
    ------
    InputError
        ``on`` not 0 or 1.
    """
    from rl_engine.errors import InputError

    if isinstance(on, bool) or on not in (0, 1):
        raise InputError(f"norm rope in lane: expected 0 or 1, got {on!r}")
    return query("rl_norm_rope_in_lane", on)

FUSED_ADD_NORM = True
"""This backend has the residual add + RMSNorm for training (:func:`add_rms_norm_train_fwd`,
:func:`rms_norm_bwd` with ``residual_grad``)."""

FUSED_NORM_ROPE = True
"""This backend has the QK-norm + RoPE for training (:func:`norm_rope_train_fwd`, :func:`rms_norm_bwd`
with ``rope``)."""


def add_rms_norm_train_fwd(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                           hf: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(s = x + delta, y = rms_norm(s), rstd [T] FP32)`` of validated [T, E] BF16 rows (unit
    stride on E) in one launch (E > :data:`ADD_RMS_MAX_E`: ``torch.add`` and the norm's launch),
    bitwise the separate ops."""
    t, e = x.shape
    if e > ADD_RMS_MAX_E:
        s = x + delta
        y, rstd = rms_norm_fwd(s, weight, eps, hf)
        return s, y, rstd
    s = torch.empty((t, e), dtype=torch.bfloat16, device=x.device)
    y = torch.empty((t, e), dtype=torch.bfloat16, device=x.device)
    rstd = torch.empty((t,), dtype=torch.float32, device=x.device)
    if t and e:
        launch(x.device, "rl_add_rms_norm_fwd", x, delta, weight, s, y, rstd, t, e, x.stride(0), delta.stride(0),
               s.stride(0), y.stride(0), float(eps), 1 if hf else 0)
    return s, y, rstd


def norm_rope_train_fwd(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                        hf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """QK-norm then RoPE of validated [T, H, D] BF16 rows (D even; cos / sin FP32 [T, D/2] with
    unit stride on the last axis) in one launch (D > :data:`NORM_ROPE_MAX_D`: the norm's launch,
    then ``rl_rope`` on its BF16 output): ``(y [T, H, D] BF16, rstd [T * H] FP32)``, bitwise the
    separate launches."""
    t, h, d = x.shape
    if d > NORM_ROPE_MAX_D:
        from rl_engine.ops.rope.cuda import rope_rotate

        yn, rstd = rms_norm_fwd(x, weight, eps, hf)
        return rope_rotate(yn, cos, sin, False), rstd
    y = torch.empty((t, h, d), dtype=torch.bfloat16, device=x.device)
    rstd = torch.empty((t * h,), dtype=torch.float32, device=x.device)
    if t and h and d:
        launch(x.device, "rl_norm_rope_fwd", x, weight, cos, sin, y, rstd, t, h, d, x.stride(0), x.stride(1),
               cos.stride(0), sin.stride(0), y.stride(0), y.stride(1), float(eps), 1 if hf else 0)
    return y, rstd
