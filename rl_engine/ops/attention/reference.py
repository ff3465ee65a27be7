"""FP32 reference for causal varlen attention with GQA, and its KV-cache decode form (WS1 §3.1).

Math: scaled dot-product attention (Vaswani et al. 2017, eq. 1) with a causal mask; grouped-query
attention (Ainslie et al. 2023) as Hugging Face Qwen3 ``repeat_kv`` does it (query head ``h`` uses
KV head ``h // (H / Hkv)``). Query ``i`` of a sequence with ``Lq`` queries and ``Lk`` keys sits at
position ``Lk - Lq + i`` and sees keys ``0 .. Lk - Lq + i``. A row with no visible key is exactly 0
(pitfall P10). Gradients come from autograd through this FP32 definition.
"""

from __future__ import annotations

import torch

from rl_engine.ops.attention._checks import check_decode, check_varlen
from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def causal_mask(lq: int, lk: int, device: torch.device) -> torch.Tensor:
    """[Lq, Lk] bool: query ``i`` (at position ``Lk - Lq + i``) sees key ``j`` iff ``j <= Lk - Lq + i``."""
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    return j <= (lk - lq + i)


def _one_sequence(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, scale: float) -> torch.Tensor:
    """qb [Lq, H, D], kb/vb [Lk, Hkv, D] float32 -> [Lq, H, D] float32."""
    lq, h, _ = qb.shape
    lk, hkv, _ = kb.shape
    group = h // hkv
    qh = qb.transpose(0, 1)  # [H, Lq, D]
    kh = kb.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, Lk, D]
    vh = vb.repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(qh, kh.transpose(1, 2)) * scale  # [H, Lq, Lk] FP32
    mask = causal_mask(lq, lk, qb.device)
    has_key = mask.any(dim=1)  # [Lq]
    # Rows with no visible key get finite dummy scores (so no NaN reaches autograd) and are zeroed.
    scores = scores.masked_fill(~mask, float("-inf"))
    scores = torch.where(has_key[None, :, None], scores, torch.zeros_like(scores))
    probs = torch.softmax(scores, dim=-1) * has_key[None, :, None]
    return torch.matmul(probs, vh).transpose(0, 1)  # [Lq, H, D]


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen GQA attention in FP32.

    q [Tq, H, D], k/v [Tk, Hkv, D] float32 (upcast BF16 values); cu_seqlens_q / cu_seqlens_k int32
    [B+1] -> [Tq, H, D] float32. Per sequence: FP32 scores ``q kᵀ * scale``, causal mask
    (bottom-right aligned), FP32 softmax, FP32 ``P V``. Differentiable in q, k, v (autograd).

    Raises
    ------
    InputError
        Bad shapes, cu_seqlens or ``Lq > Lk`` (see ``_checks.check_varlen``).
    TypeError
        A floating input that is not float32.
    """
    require_fp32(q=q, k=k, v=v)
    plan = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=torch.float32, kernel=False)
    with fp32_reference_guard():
        parts = [q.new_zeros((0,) + tuple(q.shape[1:]))]
        for b in range(plan.batch):
            qs, qe, ks, ke = plan.cu_q[b], plan.cu_q[b + 1], plan.cu_k[b], plan.cu_k[b + 1]
            if qe == qs:
                continue
            parts.append(_one_sequence(q[qs:qe], k[ks:ke], v[ks:ke], float(scale)))
        return torch.cat(parts, dim=0)


def attention_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One decode step against a static KV cache, in FP32.

    q [B, H, D], k_cache/v_cache [B, S_max, Hkv, D] float32, cache_seqlens int32 [B] ->
    [B, H, D] float32. Query ``b`` sees cache slots ``0 .. cache_seqlens[b] - 1`` (the current
    token's k/v already written at ``cache_seqlens[b] - 1``); ``cache_seqlens[b] == 0`` gives 0.
    """
    require_fp32(q=q, k_cache=k_cache, v_cache=v_cache)
    lens = check_decode(q, k_cache, v_cache, cache_seqlens, scale, dtype=torch.float32, kernel=False)
    with fp32_reference_guard():
        rows = []
        for b, n in enumerate(lens):
            if n == 0:
                rows.append(q.new_zeros((1,) + tuple(q.shape[1:])))
                continue
            rows.append(_one_sequence(q[b : b + 1], k_cache[b, :n], v_cache[b, :n], float(scale)))
        if not rows:
            return q.new_zeros(tuple(q.shape))
        return torch.cat(rows, dim=0)
