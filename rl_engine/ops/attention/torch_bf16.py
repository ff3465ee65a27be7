"""Causal varlen GQA attention in plain PyTorch BF16, the way Hugging Face eager attention runs it.

Per sequence, as ``transformers.models.qwen3.modeling_qwen3.eager_attention_forward``:
``repeat_kv`` for GQA, ``attn_weights = matmul(query, keyᵀ) * scaling`` in BF16, an additive
causal mask of ``finfo(bf16).min``, ``softmax(attn_weights, dim=-1, dtype=torch.float32)
.to(query.dtype)``, then ``matmul(attn_weights, value)`` in BF16. One deviation from HF: a row with
no visible key returns exactly 0 (the op's declared policy, ``docs/pitfalls.md`` P10) instead of a uniform
average; such rows only occur in decode with ``cache_seqlens == 0``. A second: the two matmuls
keep masked terms absent (a NaN/inf at a key a query cannot see does not reach it, forward or
backward; docs/declared-semantics.md), and a visible score of -inf is NaN (a non-finite key is not
silently dropped); on finite inputs they are the same BF16 products and give the same bits.
"""

from __future__ import annotations

import torch

from rl_engine.ops.attention._checks import check_decode, check_varlen
from rl_engine.ops.attention.reference import MaskedProduct, MaskedScores, causal_mask


def _one_sequence(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, scale: float) -> torch.Tensor:
    """qb [Lq, H, D], kb/vb [Lk, Hkv, D] bfloat16 -> [Lq, H, D] bfloat16."""
    lq, h, _ = qb.shape
    lk, hkv, _ = kb.shape
    group = h // hkv
    query = qb.transpose(0, 1)  # [H, Lq, D]
    key = kb.repeat_interleave(group, dim=1).transpose(0, 1)  # repeat_kv: [H, Lk, D]
    value = vb.repeat_interleave(group, dim=1).transpose(0, 1)
    mask = causal_mask(lq, lk, qb.device)
    # HF's matmul(query, keyᵀ) and matmul(attn_weights, value), with masked terms absent
    # (bitwise the same products on finite inputs; docs/declared-semantics.md).
    attn_weights = MaskedScores.apply(query, key, mask, scale)  # -inf where masked (+ min below stays -inf)
    additive = torch.zeros((lq, lk), dtype=attn_weights.dtype, device=qb.device)
    additive = additive.masked_fill(~mask, torch.finfo(attn_weights.dtype).min)
    attn_weights = attn_weights + additive
    attn_weights = torch.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    out = MaskedProduct.apply(attn_weights, value, mask).transpose(0, 1)  # [Lq, H, D]
    has_key = mask.any(dim=1)
    return out * has_key[:, None, None].to(out.dtype)


def attention_torch_bf16(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [Tq, H, D], k/v [Tk, Hkv, D] bfloat16, cu_seqlens int32 [B+1] -> [Tq, H, D] bfloat16.

    BF16 matmuls, FP32 softmax rounded to BF16 (HF eager). Differentiable through autograd.

    Raises
    ------
    InputError
        Bad dtypes, shapes, cu_seqlens or ``Lq > Lk``.
    """
    plan = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=torch.bfloat16, kernel=False)
    parts = [q.new_zeros((0,) + tuple(q.shape[1:]))]
    for b in range(plan.batch):
        qs, qe, ks, ke = plan.cu_q[b], plan.cu_q[b + 1], plan.cu_k[b], plan.cu_k[b + 1]
        if qe == qs:
            continue
        parts.append(_one_sequence(q[qs:qe], k[ks:ke], v[ks:ke], float(scale)))
    return torch.cat(parts, dim=0)


def attention_decode_torch_bf16(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, H, D], k_cache/v_cache [B, S_max, Hkv, D] bfloat16, cache_seqlens int32 [B] -> [B, H, D] bfloat16."""
    lens = check_decode(q, k_cache, v_cache, cache_seqlens, scale, dtype=torch.bfloat16, kernel=False)
    rows = [q.new_zeros((0,) + tuple(q.shape[1:]))]
    for b, n in enumerate(lens):
        if n == 0:
            rows.append(q.new_zeros((1,) + tuple(q.shape[1:])))
            continue
        rows.append(_one_sequence(q[b : b + 1], k_cache[b, :n], v_cache[b, :n], float(scale)))
    return torch.cat(rows, dim=0)
