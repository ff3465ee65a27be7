"""FP32 reference for causal varlen attention with GQA, and its KV-cache decode form (WS1 §3.1).

Math: scaled dot-product attention (Vaswani et al. 2017, eq. 1) with a causal mask; grouped-query
attention (Ainslie et al. 2023) as Hugging Face Qwen3 ``repeat_kv`` does it (query head ``h`` uses
KV head ``h // (H / Hkv)``). Query ``i`` of a sequence with ``Lq`` queries and ``Lk`` keys sits at
position ``Lk - Lq + i`` and sees keys ``0 .. Lk - Lq + i``. A row with no visible key is exactly 0
(pitfall P10). Masked means absent (docs/declared-semantics.md): a value at a position a query
cannot see (a future key, another sequence, a cache slot past the length) enters no product of
that query, forward or backward, so a NaN/inf there changes nothing; a visible NaN/inf makes the
outputs it reaches NaN. Gradients come from autograd through this FP32 definition, with the two
masked products (scores and ``P V``) given explicit backward formulas that keep masked terms
absent (``MaskedScores``, ``MaskedProduct``); no [T, T, D] tensor is formed.
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


def _absent_matmul(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor, *, as_transpose: bool = False) -> torch.Tensor:
    """``sum over k with keep[i, k]`` of ``a[..., i, k] * b[..., k, n]``: the other terms are absent.

    a [..., M, K], b [..., K, N] (same floating dtype), keep [M, K] bool -> [..., M, N] in that
    dtype. Not ``where(keep, a, 0) @ b``: that is ``0 * NaN = NaN`` for a non-finite ``b`` at a
    masked ``k``. ``b``'s non-finite values are replaced by 0 for the product (the identity on
    finite values, so finite inputs give exactly ``where(keep, a, 0) @ b``), and an exact 0/1 count
    ``keep @ nonfinite(b)`` (a [..., M, N] matmul, never a [M, K, N] tensor) makes every output
    element that a *kept* non-finite ``b`` reaches NaN (declared semantics,
    docs/declared-semantics.md). ``as_transpose`` computes the same sum as ``(bᵀ @ aᵀ)ᵀ``, the
    arrangement autograd uses for the second operand of a matmul, so finite inputs give the very
    bits the plain autograd formulation gave.
    """
    b_ok = torch.isfinite(b)
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    if as_transpose:
        out = torch.matmul(torch.where(b_ok, b, zero).transpose(-1, -2),
                           torch.where(keep.transpose(0, 1), a.transpose(-1, -2), zero)).transpose(-1, -2)
    else:
        out = torch.matmul(torch.where(keep, a, zero), torch.where(b_ok, b, zero))
    count = torch.matmul(keep.to(a.dtype), (~b_ok).to(a.dtype))
    return torch.where(count > 0, torch.full((), float("nan"), dtype=out.dtype, device=out.device), out)


class MaskedProduct(torch.autograd.Function):
    """``a @ b`` with the terms ``keep[i, k] == False`` absent, forward and backward.

    a [..., M, K], b [..., K, N], keep [M, K] bool -> [..., M, N]. Gradients: ``da = where(keep,
    g @ bᵀ, 0)`` (masked entries of ``a`` get exactly 0) and ``db = _absent_matmul(aᵀ, g, keepᵀ)``
    (the upstream gradient of a row that does not keep ``k`` is absent from ``db[k]``). On finite
    inputs this is the autograd of ``where(keep, a, 0) @ b`` up to the sign of exact zeros.
    """

    @staticmethod
    def forward(ctx, a, b, keep):
        ctx.save_for_backward(a, b, keep)
        return _absent_matmul(a, b, keep)

    @staticmethod
    def backward(ctx, g):
        a, b, keep = ctx.saved_tensors
        zero = torch.zeros((), dtype=g.dtype, device=g.device)
        da = torch.where(keep, torch.matmul(g, b.transpose(-1, -2)), zero) if ctx.needs_input_grad[0] else None
        db = _absent_matmul(a.transpose(-1, -2), g, keep.transpose(0, 1)) if ctx.needs_input_grad[1] else None
        return da, db, None


class MaskedScores(torch.autograd.Function):
    """``where(keep, q @ kᵀ, 0)`` whose gradients ignore the masked entries completely.

    q [..., M, D], k [..., N, D], keep [M, N] bool -> [..., M, N]. ``dq = _absent_matmul(g, k,
    keep)`` and ``dk = _absent_matmul(gᵀ, q, keepᵀ)``: a key a query cannot see never meets that
    query's gradient, and a masked NaN/inf key or query never reaches anyone's gradient.
    """

    @staticmethod
    def forward(ctx, q, k, keep):
        ctx.save_for_backward(q, k, keep)
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        return torch.where(keep, torch.matmul(q, k.transpose(-1, -2)), zero)

    @staticmethod
    def backward(ctx, g):
        q, k, keep = ctx.saved_tensors
        dq = _absent_matmul(g, k, keep) if ctx.needs_input_grad[0] else None
        dk = (_absent_matmul(g.transpose(-1, -2), q, keep.transpose(0, 1), as_transpose=True)
              if ctx.needs_input_grad[1] else None)
        return dq, dk, None


def _one_sequence(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, scale: float) -> torch.Tensor:
    """qb [Lq, H, D], kb/vb [Lk, Hkv, D] float32 -> [Lq, H, D] float32.

    Masked (future) keys are absent from every product, forward and backward (MaskedScores,
    MaskedProduct); a visible score of -inf (only a non-finite q or k makes one) is NaN.
    """
    lq, h, _ = qb.shape
    lk, hkv, _ = kb.shape
    group = h // hkv
    qh = qb.transpose(0, 1)  # [H, Lq, D]
    kh = kb.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, Lk, D]
    vh = vb.repeat_interleave(group, dim=1).transpose(0, 1)
    mask = causal_mask(lq, lk, qb.device)
    scores = MaskedScores.apply(qh, kh, mask) * scale  # [H, Lq, Lk] FP32
    scores = torch.where(scores == float("-inf"), torch.full_like(scores, float("nan")), scores)
    has_key = mask.any(dim=1)  # [Lq]
    # Rows with no visible key get finite dummy scores (so no NaN reaches autograd) and are zeroed.
    scores = scores.masked_fill(~mask, float("-inf"))
    scores = torch.where(has_key[None, :, None], scores, torch.zeros_like(scores))
    probs = torch.softmax(scores, dim=-1) * has_key[None, :, None]
    return MaskedProduct.apply(probs, vh, mask).transpose(0, 1)  # [Lq, H, D]


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
    Masked means absent (docs/declared-semantics.md): k / v of keys a query cannot see (future
    keys, other sequences) and q / dO of queries that cannot see a key take no part in that
    query's output or that key's gradients, so NaN / inf there changes nothing (bitwise). A
    non-finite q or visible k makes the row NaN, a visible non-finite v component makes that
    output component non-finite (NaN or inf).

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
