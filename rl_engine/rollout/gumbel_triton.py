"""One Triton kernel for the unfiltered Gumbel-max draw of :mod:`rl_engine.rollout.sampling`.

``argmax_v(s[b, v] + G[b, v])`` with ``s = logits / temperature`` (FP32, IEEE division) and the
Gumbel noise ``G = -log(-log u)`` of the counter-based uniforms, computed for a whole row in one pass
over ``V`` instead of ~100 elementwise float64 kernels over ``[B, V]`` (on the H200 those took about
5 ms of a 16 ms Qwen3-8B decode step at B = 64). Only for sampling without top-k / top-p (those keep
the sort-based path).

Same bits as :class:`rl_engine.rollout.sampling.Sampler` by construction: the same integer hash, the
same float64 operations in the same order (each a single IEEE operation: no FMA contraction,
``enable_fp_fusion`` off; every constant made a float64 from the same Python double; ``frexp`` by
bit manipulation, exact for the normal numbers that occur here), the FP32 division rounded to
nearest (``div_rn``), and argmax's rule: the first maximum, a NaN above everything. Tested against
the reference sampler bit for bit in the CPU interpreter (``tests/rollout/test_rollout_sampling.py``);
not yet run on a GPU, so the sampler uses it there only once
:data:`rl_engine.rollout.sampling.FUSED_DRAW_ON_CUDA` is turned on (after that test passes on the H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION
from rl_engine.rollout import _f64 as ref

BLOCK_V = 1024


@triton.jit
def _mul32(x, c: tl.constexpr):
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) * 65536
    return (lo + hi) & 0xFFFFFFFF


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


@triton.jit
def _f64(c: tl.constexpr):
    return tl.full((), c, tl.float64)


@triton.jit
def _log_f64(x, SQRT_HALF: tl.constexpr, LN2_HI: tl.constexpr, LN2_LO: tl.constexpr, TERMS: tl.constexpr):
    """:func:`rl_engine.rollout.sampling.log_f64` for positive normal float64 ``x``."""
    bits = x.to(tl.int64, bitcast=True)
    e = ((bits >> 52) & 0x7FF) - 1022  # x = m 2^e, m in [0.5, 1) (torch.frexp's convention)
    m = ((bits & 0x000FFFFFFFFFFFFF) | (1022 << 52)).to(tl.float64, bitcast=True)  # x > 0: sign bit 0
    small = m < _f64(SQRT_HALF)
    m = tl.where(small, m * _f64(2.0), m)
    ef = (e - small.to(tl.int64)).to(tl.float64)
    f = (m - _f64(1.0)) / (m + _f64(1.0))
    s = f * f
    poly = tl.zeros_like(s) + _f64(1.0 / (2 * TERMS - 1))
    for i in tl.static_range(TERMS - 1):  # k = TERMS - 2 .. 0, as the reference's loop
        poly = poly * s + _f64(1.0 / (2 * (TERMS - 2 - i) + 1))
    return ef * _f64(LN2_HI) + (ef * _f64(LN2_LO) + (f * _f64(2.0)) * poly)


@triton.jit
def _gumbel_argmax_kernel(logits_ptr, keys_ptr, tau_ptr, out_ptr, score_ptr, V, stride_b,
                          SQRT_HALF: tl.constexpr, LN2_HI: tl.constexpr, LN2_LO: tl.constexpr,
                          TERMS: tl.constexpr, BLOCK: tl.constexpr, WRITE_SCORE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + b)
    tau = tl.load(tau_ptr)
    h = _mix32(key ^ 0x85EBCA6B)
    best_val = tl.full((), float("-inf"), tl.float64)
    best_idx = tl.full((), 0, tl.int64)
    best_nan = tl.full((), 0, tl.int1)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    for v0 in range(0, V, BLOCK):
        v = v0 + offs
        ok = v < V
        z = tl.load(logits_ptr + b * stride_b + v, mask=ok, other=0.0)
        s = tl.math.div_rn(z, tau).to(tl.float64)
        a = _mix32(h ^ v)
        c = _mix32(a ^ 0x27D4EB2F)
        u = (((a >> 12) * 4294967296 + c).to(tl.float64) + _f64(0.5)) * _f64(2.0 ** -52)
        g = -_log_f64(-_log_f64(u, SQRT_HALF, LN2_HI, LN2_LO, TERMS), SQRT_HALF, LN2_HI, LN2_LO, TERMS)
        score = s + g
        if WRITE_SCORE:  # tests: the float64 scores themselves, to compare bit for bit
            tl.store(score_ptr + b * V + v, score, mask=ok)
        isnan = (score != score) & ok
        big = V + BLOCK
        nan_idx = tl.min(tl.where(isnan, v, big), axis=0)
        masked = tl.where(ok & ~isnan, score, float("-inf"))
        blk_val = tl.max(masked, axis=0)
        blk_idx = tl.min(tl.where((masked == blk_val) & ok & ~isnan, v, big), axis=0)
        blk_nan = nan_idx < big
        take_nan = blk_nan & ~best_nan
        take_val = ~blk_nan & ~best_nan & (blk_val > best_val)
        best_idx = tl.where(take_nan, nan_idx, tl.where(take_val, blk_idx, best_idx))
        best_val = tl.where(take_val, blk_val, best_val)
        best_nan = best_nan | blk_nan
    tl.store(out_ptr + b, best_idx)


def gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor, temperature: float, *,
                  return_scores: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """tokens [B] int64 = ``argmax(logits / temperature + G)`` row by row; logits [B, V] float32 with
    unit stride on V, keys [B] int64 (:func:`rl_engine.rollout.sampling.row_keys`), temperature > 0.
    ``return_scores``: also the float64 scores [B, V] (for tests; costs a [B, V] float64 write).

    Raises
    ------
    InputError
        Wrong dtype, shape or stride, or a temperature that is not > 0.
    """
    from rl_engine.errors import InputError

    if logits.dim() != 2 or logits.dtype != torch.float32 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise InputError(f"logits: expected [B, V] float32 with unit stride on V, got {list(logits.shape)} "
                         f"{logits.dtype} strides {list(logits.stride())}")
    if keys.shape != (logits.shape[0],) or keys.dtype != torch.int64 or keys.device != logits.device:
        raise InputError(f"keys: expected [B] int64 on {logits.device}, got {list(keys.shape)} {keys.dtype} {keys.device}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise InputError(f"temperature: expected a number > 0 for a draw, got {temperature!r}")
    b, v = logits.shape
    out = torch.empty((b,), dtype=torch.int64, device=logits.device)
    scores = torch.empty((b, v) if return_scores else (1,), dtype=torch.float64, device=logits.device)
    if b:
        tau = torch.full((1,), float(temperature), dtype=torch.float32, device=logits.device)
        _gumbel_argmax_kernel[(b,)](
            logits, keys, tau, out, scores, v, logits.stride(0),
            SQRT_HALF=ref._SQRT_HALF, LN2_HI=ref._LN2_HI, LN2_LO=ref._LN2_LO, TERMS=ref._LOG_TERMS, BLOCK=BLOCK_V,
            WRITE_SCORE=return_scores, num_warps=4, enable_fp_fusion=FP_FUSION)
    return (out, scores) if return_scores else out


__all__ = ["gumbel_argmax"]
