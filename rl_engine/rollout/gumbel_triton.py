"""Two Triton kernels for the unfiltered Gumbel-max draw of :mod:`rl_engine.rollout.sampling`.

``argmax_v(s[b, v] + G[b, v])`` with ``s = logits / temperature`` (FP32, IEEE division) and the
Gumbel noise ``G = -log(-log u)`` of the counter-based uniforms, computed in one pass over ``V``
(split into fixed chunks of :data:`CHUNK_V` ids, then one small kernel combines the chunks) instead
of ~100 elementwise float64 kernels over ``[B, V]`` (on the H200 those took about 5 ms of a 16 ms
Qwen3-8B decode step at B = 64). Only for sampling without top-k / top-p (those keep the sort-based
path).

Same bits as :class:`rl_engine.rollout.sampling.Sampler` by construction: the same integer hash, the
same float64 operations in the same order (each a single IEEE operation: no FMA contraction,
``enable_fp_fusion`` off; every constant made a float64 from the same Python double; ``frexp`` by
bit manipulation, exact for the normal numbers that occur here), the FP32 division rounded to
nearest (``div_rn``), and argmax's rule: the first maximum, a NaN above everything. Tested against
the reference sampler bit for bit (``tests/rollout/test_rollout_sampling.py``) in the CPU
interpreter; on the H200 that test passed for the one-program-per-row form of b5b86f9
(``evidence/2026-12-01-h200-decode-5c38f19/round2-b5b86f9/``) and for this chunked form
(``round5-cd73cc6-flags-on/``). ``tests/ops/test_sm90_compile.py``
compiles both kernels for sm_90 on the CPU (the first chunked version failed to compile on the H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, next_power_of_2
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
def _gumbel_partial_kernel(logits_ptr, keys_ptr, tau_ptr, pval_ptr, pidx_ptr, pnan_ptr, score_ptr, V, stride_b,
                           n_chunks, SQRT_HALF: tl.constexpr, LN2_HI: tl.constexpr, LN2_LO: tl.constexpr,
                           TERMS: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                           WRITE_SCORE: tl.constexpr):
    """Program (b, c): the first maximum of the scores of row b over ids [c*CHUNK, (c+1)*CHUNK) (its
    first id when every score there is -inf) and the first NaN id there (V + CHUNK when none)."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    key = tl.load(keys_ptr + b)
    tau = tl.load(tau_ptr)
    h = _mix32(key ^ 0x85EBCA6B)
    first = c * CHUNK
    best_val = tl.full((), float("-inf"), tl.float64)
    best_idx = first
    best_nan = tl.full((), 0, tl.int1)
    nan_at = tl.full((), CHUNK, tl.int64) + V  # int64 like the loop's ids (V is an int32 argument)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    for v0 in range(0, CHUNK, BLOCK):
        v = first + v0 + offs
        ok = v < V
        z = tl.load(logits_ptr + b * stride_b + v, mask=ok, other=0.0)
        s = tl.math.div_rn(z, tau).to(tl.float64)
        a = _mix32(h ^ v)
        cc = _mix32(a ^ 0x27D4EB2F)
        u = (((a >> 12) * 4294967296 + cc).to(tl.float64) + _f64(0.5)) * _f64(2.0 ** -52)
        g = -_log_f64(-_log_f64(u, SQRT_HALF, LN2_HI, LN2_LO, TERMS), SQRT_HALF, LN2_HI, LN2_LO, TERMS)
        score = s + g
        if WRITE_SCORE:  # tests: the float64 scores themselves, to compare bit for bit
            tl.store(score_ptr + b * V + v, score, mask=ok)
        isnan = (score != score) & ok
        big = V + CHUNK
        nan_idx = tl.min(tl.where(isnan, v, big), axis=0)
        masked = tl.where(ok & ~isnan, score, float("-inf"))
        blk_val = tl.max(masked, axis=0)
        blk_idx = tl.min(tl.where((masked == blk_val) & ok & ~isnan, v, big), axis=0)
        blk_nan = nan_idx < big
        take_val = ~blk_nan & ~best_nan & (blk_val > best_val)
        nan_at = tl.where(blk_nan & ~best_nan, nan_idx, nan_at)
        best_idx = tl.where(take_val, blk_idx, best_idx)
        best_val = tl.where(take_val, blk_val, best_val)
        best_nan = best_nan | blk_nan
    tl.store(pval_ptr + b * n_chunks + c, best_val)
    tl.store(pidx_ptr + b * n_chunks + c, best_idx)
    tl.store(pnan_ptr + b * n_chunks + c, nan_at)


@triton.jit
def _gumbel_reduce_kernel(pval_ptr, pidx_ptr, pnan_ptr, out_ptr, n_chunks, NO_NAN, CHUNKS_P2: tl.constexpr):
    """Row b's token from its chunks: the first NaN id if any (NaN is above everything, as in
    torch.argmax), else the lowest id among the chunks holding the row maximum (each chunk reports
    its first maximum, so this is the first maximum of the row: the order of the chunks cannot matter)."""
    b = tl.program_id(0).to(tl.int64)
    cs = tl.arange(0, CHUNKS_P2)
    ok = cs < n_chunks
    val = tl.load(pval_ptr + b * n_chunks + cs, mask=ok, other=float("-inf"))
    idx = tl.load(pidx_ptr + b * n_chunks + cs, mask=ok, other=NO_NAN)
    nan_at = tl.load(pnan_ptr + b * n_chunks + cs, mask=ok, other=NO_NAN)
    first_nan = tl.min(nan_at, axis=0)
    top = tl.max(val, axis=0)
    first_top = tl.min(tl.where(ok & (val == top), idx, NO_NAN), axis=0)
    tl.store(out_ptr + b, tl.where(first_nan < NO_NAN, first_nan, first_top))


CHUNK_V = 4096
"""Vocabulary ids per program of the partial kernel: a row is split into ``ceil(V / CHUNK_V)``
programs (38 at V = 151936), so a draw at B = 1 does not run on one SM (one program per row took
0.59 ms on the H200); the chunks' results are combined by the argmax rule, which no order changes."""


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
    if b and v:
        n_chunks = cdiv(v, CHUNK_V)
        tau = torch.full((1,), float(temperature), dtype=torch.float32, device=logits.device)
        pval = torch.empty((b, n_chunks), dtype=torch.float64, device=logits.device)
        pidx = torch.empty((b, n_chunks), dtype=torch.int64, device=logits.device)
        pnan = torch.empty((b, n_chunks), dtype=torch.int64, device=logits.device)
        _gumbel_partial_kernel[(b, n_chunks)](
            logits, keys, tau, pval, pidx, pnan, scores, v, logits.stride(0), n_chunks,
            SQRT_HALF=ref._SQRT_HALF, LN2_HI=ref._LN2_HI, LN2_LO=ref._LN2_LO, TERMS=ref._LOG_TERMS, BLOCK=BLOCK_V,
            CHUNK=CHUNK_V, WRITE_SCORE=return_scores, num_warps=4, enable_fp_fusion=FP_FUSION)
        _gumbel_reduce_kernel[(b,)](pval, pidx, pnan, out, n_chunks, v + CHUNK_V,
                                    CHUNKS_P2=next_power_of_2(n_chunks), num_warps=1,
                                    enable_fp_fusion=FP_FUSION)
    elif b:
        raise InputError("logits: an empty vocabulary has no token to draw")
    return (out, scores) if return_scores else out


@triton.jit
def _row_keys_kernel(seq_ptr, pos_ptr, out_ptr, B, seed_lo, seed_hi, BLOCK: tl.constexpr):
    """:func:`rl_engine.rollout.sampling.row_keys` for ``BLOCK`` rows: the same five mixes of the
    same 32-bit words, in int64 (exact integer arithmetic, so the same bits)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B
    seq = tl.load(seq_ptr + offs, mask=ok, other=0)
    pos = tl.load(pos_ptr + offs, mask=ok, other=0)
    k = _mix32(tl.zeros((BLOCK,), dtype=tl.int64) + seed_lo)
    k = _mix32(k ^ seed_hi)
    k = _mix32(k ^ (seq & 0xFFFFFFFF))
    k = _mix32(k ^ ((seq >> 32) & 0xFFFFFFFF))
    k = _mix32(k ^ (pos & 0xFFFFFFFF))
    tl.store(out_ptr + offs, k, mask=ok)


KEYS_BLOCK = 256


def row_keys_kernel(seed: int, seq_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B] int64 keys of (seed, sequence id, position) in one launch, bitwise
    :func:`rl_engine.rollout.sampling.row_keys` (about 100 elementwise launches; tested). seq_ids,
    positions [B] int64 >= 0 on one device; seed an integer in [0, 2^64) (validated by
    :class:`~rl_engine.rollout.sampling.SamplingParams`).

    Raises
    ------
    InputError
        seq_ids and positions not [B] int64 on one device.
    """
    from rl_engine.errors import InputError

    b = seq_ids.shape[0] if seq_ids.dim() == 1 else -1
    for name, t in (("seq_ids", seq_ids), ("positions", positions)):
        if t.dim() != 1 or t.shape[0] != b or t.dtype != torch.int64 or t.device != seq_ids.device:
            raise InputError(f"{name}: expected [B] int64 on {seq_ids.device}, got {list(t.shape)} {t.dtype} {t.device}")
    out = torch.empty((b,), dtype=torch.int64, device=seq_ids.device)
    if b:
        seed_lo = (int(seed) & 0xFFFFFFFF) ^ 0x9E3779B9
        seed_hi = (int(seed) >> 32) & 0xFFFFFFFF
        _row_keys_kernel[(cdiv(b, KEYS_BLOCK),)](seq_ids.contiguous(), positions.contiguous(), out, b, seed_lo,
                                                        seed_hi, BLOCK=KEYS_BLOCK, num_warps=4,
                                                        enable_fp_fusion=FP_FUSION)
    return out


__all__ = ["gumbel_argmax", "row_keys_kernel"]
