"""CUDA C++ causal varlen GQA attention (``cuda_bf16`` backend): forward, deterministic backward,
and one decode step against a static KV cache.

Kernels in ``rl_engine/backends/cuda_src/attention.cu`` (forward, decode) and
``attention_bwd.cu`` (backward); CUDA cores, FP32 arithmetic, FMAs written out explicitly
(the library is built with ``-fmad=false``).

Forward: one block of 256 threads per 64 queries of one head (prefill) or per 16 query heads of
one KV-head group (decode). The keys of a sequence are visited in the fixed blocks
``[0, 64), [64, 128), ...`` in increasing order in every path. Scores are FMA chains over D in
order, times ``scale``; per block and row: ``m_new = max(m, block max)``, ``alpha = 1`` if the max
did not move else ``exp(m - m_new)``, ``p = exp(s - m_new)`` (FP32, not rounded), ``l = l * alpha +
rowsum(p)`` with a fixed 16-lane reduction, ``o = o * alpha`` then ``o = fma(p_j, v_j, o)`` in key
order; finally ``out = o / l`` (IEEE division) rounded once to BF16, 0 for a row with no visible key
(pitfall P10), and ``lse = m + log(l)`` kept for the backward. A KV block wholly past a row's
causal limit leaves that row's state bitwise unchanged, and prefill and decode call the same
per-row code with the same block size, so a query's output is bitwise the same in a full prefill,
a chunked prefill or a decode step (pitfall P8). No split over the KV axis; every launch constant
is fixed.

Backward (FlashAttention-2 structure, Dao 2023; deterministic, no atomics): ``delta =
rowsum(dO * O)``; a dQ kernel per 64 queries of one head (KV blocks in increasing order) and a
dK/dV kernel per 64 keys of one KV head (query heads of the group in order, queries in increasing
order), each gradient element a sequential FP32 FMA chain, ``scale`` applied once at the end,
rounded once to BF16.

Head dim: D in {16, 32, 64, 128, 256} (a kernel template per size).
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch, query, unit_last
from rl_engine.errors import InputError
from rl_engine.ops.attention._checks import VarlenPlan, check_decode, check_varlen

HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head dims with a compiled kernel."""


def _check_head_dim(d: int) -> None:
    if d not in HEAD_DIMS:
        raise InputError(f"head dim D={d} has no cuda_bf16 kernel; supported: {', '.join(map(str, HEAD_DIMS))}")


def _forward(q, k, v, cu_q, cu_k, scale: float, plan: VarlenPlan) -> tuple[torch.Tensor, torch.Tensor]:
    tq, h, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((tq, h, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    if tq == 0 or plan.batch == 0:
        return out, lse
    bq = query("rl_attention_block_q")
    n_mblocks = -(-plan.max_lq // bq)
    launch(q.device, "rl_attention_fwd", q, k, v, out, lse, cu_q, cu_k, plan.batch, n_mblocks, h, hkv, d,
           q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
           lse.stride(0), float(scale))
    return out, lse


def _backward(q, k, v, out, lse, do, cu_q, cu_k, scale: float, plan: VarlenPlan):
    tq, h, d = q.shape
    tk, hkv, _ = k.shape
    # Every row is written by a kernel (every token belongs to a sequence), so no zero fill.
    dq = torch.empty((tq, h, d), dtype=torch.bfloat16, device=q.device)
    dk = torch.empty((tk, hkv, d), dtype=torch.bfloat16, device=q.device)
    dv = torch.empty((tk, hkv, d), dtype=torch.bfloat16, device=q.device)
    if tk == 0 or plan.batch == 0:
        return dq, dk, dv
    delta = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    launch(q.device, "rl_attention_bwd_delta", out, do, delta, tq, h, d, out.stride(0), out.stride(1),
           do.stride(0), do.stride(1), delta.stride(0))
    bq = query("rl_attention_block_q")
    bkv = query("rl_attention_block_kv")
    n_mblocks = -(-plan.max_lq // bq)
    n_nblocks = -(-plan.max_lk // bkv)
    launch(q.device, "rl_attention_bwd", q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, plan.batch, n_mblocks,
           n_nblocks, h, hkv, d, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
           do.stride(0), do.stride(1), lse.stride(0), dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1),
           dv.stride(0), dv.stride(1), float(scale))
    return dq, dk, dv


class _AttentionCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, scale, plan):
        out, lse = _forward(q, k, v, cu_q, cu_k, scale, plan)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.scale = scale
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        do = unit_last(do.to(torch.bfloat16))
        dq, dk, dv = _backward(q, k, v, out, lse, do, cu_q, cu_k, ctx.scale, ctx.plan)
        return dq, dk, dv, None, None, None, None


def attention_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen GQA attention with CUDA C++ kernels (forward and backward).

    q [Tq, H, D], k/v [Tk, Hkv, D] bfloat16 with unit stride on D (token / head strides free);
    cu_seqlens_q / cu_seqlens_k int32 [B+1] on the same device -> [Tq, H, D] bfloat16. Query ``i``
    of sequence ``b`` sits at position ``Lk - Lq + i`` and sees keys ``0 .. Lk - Lq + i``; query
    head ``h`` uses KV head ``h // (H / Hkv)``. FP32 scores, softmax and accumulation, one rounding
    to BF16 (see the module notes). Backward: dq [Tq, H, D], dk / dv [Tk, Hkv, D] bfloat16,
    deterministic (no atomics). Math: Vaswani et al. 2017; online softmax and backward of
    FlashAttention-2 (Dao 2023). Masked means absent (docs/declared-semantics.md): k / v of keys a query cannot see (future
    keys, other sequences) and q / dO of queries that cannot see a key take no part in that
    query's output or that key's gradients, so NaN / inf there changes nothing (bitwise). A
    non-finite q or visible k makes the row NaN, a visible non-finite v component makes that
    output component non-finite (NaN or inf).

    Raises
    ------
    InputError
        Wrong dtype, shape or device, non-unit stride on D, D not in {16, 32, 64, 128, 256},
        ``H % Hkv != 0``, malformed cu_seqlens, or ``Lq > Lk`` for a sequence.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    plan = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=torch.bfloat16, kernel=True)
    _check_head_dim(q.shape[2])
    check_cuda_device(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return _AttentionCuda.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, float(scale), plan)


def attention_decode_cuda(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One decode step against a static KV cache with CUDA C++ (inference only, no gradient).

    q [B, H, D], k_cache / v_cache [B, S_max, Hkv, D] bfloat16 (unit stride on D, other strides
    free), cache_seqlens int32 [B] in [0, S_max] -> [B, H, D] bfloat16. Query ``b`` sees cache
    slots ``0 .. cache_seqlens[b] - 1``; slots past it are never read; ``cache_seqlens[b] == 0``
    gives 0. Bitwise equal to the same query's row of :func:`attention_cuda` in a full prefill
    (same KV block size and order, same per-row code). Masked means absent: NaN / inf in the slots past ``cache_seqlens[b]`` changes nothing; a
    visible one makes the outputs it reaches non-finite (docs/declared-semantics.md).

    Raises
    ------
    InputError
        Wrong dtype, shape or device, non-unit stride on D, D not in {16, 32, 64, 128, 256},
        ``H % Hkv != 0``, cache_seqlens outside [0, S_max], or inputs that require grad while grad
        mode is on (decode is inference only).
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_decode(q, k_cache, v_cache, cache_seqlens, scale, dtype=torch.bfloat16, kernel=True)
    _check_head_dim(q.shape[2])
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        raise InputError("attention_decode is inference only: call it under torch.no_grad() or on tensors "
                         "that do not require grad")
    check_cuda_device(q, k_cache, v_cache, cache_seqlens)
    bsz, h, d = q.shape
    hkv = k_cache.shape[2]
    out = torch.empty((bsz, h, d), dtype=torch.bfloat16, device=q.device)
    if bsz == 0:
        return out
    launch(q.device, "rl_attention_decode", q, k_cache, v_cache, out, cache_seqlens, bsz, h, hkv, d,
           q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
           v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), float(scale))
    return out
