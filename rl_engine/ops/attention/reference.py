"""FP32 reference for causal varlen attention with GQA, and its KV-cache decode form (WS1 §3.1).

Math: scaled dot-product attention (Vaswani et al. 2017, eq. 1) with a causal mask; grouped-query
attention (Ainslie et al. 2023) as Hugging Face Qwen3 ``repeat_kv`` does it (query head ``h`` uses
KV head ``h // (H / Hkv)``). Query ``i`` of a sequence with ``Lq`` queries and ``Lk`` keys sits at
position ``Lk - Lq + i`` and sees keys ``0 .. Lk - Lq + i``. A row with no visible key is exactly 0
(``docs/pitfalls.md`` P10). Masked means absent (docs/declared-semantics.md): a value at a position a query
cannot see (a future key, another sequence, a cache slot past the length) enters no product of
that query, forward or backward, so a NaN/inf there changes nothing; a visible NaN/inf makes the
outputs it reaches NaN. Gradients come from autograd through this FP32 definition, with the two
masked products (scores and ``P V``) given explicit backward formulas that keep masked terms
absent (``MaskedScores``, ``MaskedProduct``); no [T, T, D] tensor is formed.
"""

from __future__ import annotations

import contextlib

import torch

from rl_engine.ops.attention._checks import check_decode, check_varlen
from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def causal_mask(lq: int, lk: int, device: torch.device) -> torch.Tensor:
    """[Lq, Lk] bool: query ``i`` (at position ``Lk - Lq + i``) sees key ``j`` iff ``j <= Lk - Lq + i``."""
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    return j <= (lk - lq + i)


def _absent_matmul(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor, *, as_transpose: bool = False,
                   a_masked: bool = False) -> torch.Tensor:
    """``sum over k with keep[i, k]`` of ``a[..., i, k] * b[..., k, n]``: the other terms are absent.

    a [..., M, K], b [..., K, N] (same floating dtype), keep [M, K] bool -> [..., M, N] in that
    dtype. Not ``where(keep, a, 0) @ b``: that is ``0 * NaN = NaN`` for a non-finite ``b`` at a
    masked ``k``. ``b``'s non-finite values are replaced by 0 for the product (the identity on
    finite values, so finite inputs give exactly ``where(keep, a, 0) @ b``), and an exact 0/1 count
    ``keep @ nonfinite(b)`` (a [..., M, N] matmul, never a [M, K, N] tensor) makes every output
    element that a *kept* non-finite ``b`` reaches NaN (declared semantics,
    docs/declared-semantics.md). ``as_transpose`` computes the same sum as ``(bᵀ @ aᵀ)ᵀ``, the
    arrangement autograd uses for the second operand of a matmul, so finite inputs give the very
    bits the plain autograd formulation gave. ``a_masked`` says ``a`` is already exactly 0 where
    ``keep`` is False (saves a copy of ``a``).
    """
    b_ok = torch.isfinite(b)
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    a_kept = a if a_masked else torch.where(keep, a, zero)
    with _plain_cpu_gemm(a):
        if as_transpose:
            out = torch.matmul(torch.where(b_ok, b, zero).transpose(-1, -2), a_kept.transpose(-1, -2)).transpose(-1, -2)
        else:
            out = torch.matmul(a_kept, torch.where(b_ok, b, zero))
    # (nonfinite(b)ᵀ @ keepᵀ)ᵀ: a batched [..., N, K] times a 2-D [K, M] folds the batch into rows,
    # so the [M, K] mask is never expanded to [..., M, K].
    # The count is an FP32 product of 0/1 values (exact), whatever a's dtype: on an AVX-512 host the
    # BF16 CPU matmul made a count > 0 where none is (H200 host, torch 2.11: the row before a
    # planted future key became NaN in torch_bf16), so the count never goes through a BF16 GEMM.
    count = torch.matmul((~b_ok).to(torch.float32).transpose(-1, -2),
                         keep.transpose(0, 1).to(torch.float32)).transpose(-1, -2)
    return torch.where(count > 0, torch.full((), float("nan"), dtype=out.dtype, device=out.device), out)


def _plain_cpu_gemm(a: torch.Tensor):
    """BF16 products on the CPU without oneDNN. Measured on the H200 host (AVX-512, torch 2.11):
    oneDNN's BF16 GEMM gave row ``i`` of ``a @ b`` other bits when only a row ``k`` of ``b`` with
    ``a[i, k] == 0`` changed (a planted future key moved the query row before it); with oneDNN off
    the result did not move, and it is the GEMM an AVX2 host runs anyway. Every product of the
    masked scores and ``P V`` (forward and backward) uses it, so ``torch_bf16`` attention on a CPU
    runs one GEMM on every host. Other dtypes and devices are left alone."""
    if a.device.type == "cpu" and a.dtype == torch.bfloat16:
        return torch.backends.mkldnn.flags(enabled=False)
    return contextlib.nullcontext()


def _backward_guard(dtype: torch.dtype):
    """The FP32 guard for a backward (autograd runs it after the forward's guard has closed):
    TF32 and autocast off for FP32; nothing to change for the BF16 path of ``torch_bf16``."""
    return fp32_reference_guard() if dtype == torch.float32 else contextlib.nullcontext()


class MaskedProduct(torch.autograd.Function):
    """``a @ b`` with the terms ``keep[i, k] == False`` absent, forward and backward.

    a [..., M, K], b [..., K, N], keep [M, K] bool -> [..., M, N]. Gradients: ``da = where(keep,
    g @ bᵀ, 0)`` (masked entries of ``a`` get exactly 0) and ``db = _absent_matmul(aᵀ, g, keepᵀ)``
    (the upstream gradient of a row that does not keep ``k`` is absent from ``db[k]``). On finite
    inputs this is the autograd of ``where(keep, a, 0) @ b`` up to the sign of exact zeros. The
    backward of FP32 inputs runs under :func:`fp32_reference_guard` (autograd calls it after the
    forward's guard has closed).
    """

    @staticmethod
    def forward(ctx, a, b, keep):
        ctx.save_for_backward(a, b, keep)
        return _absent_matmul(a, b, keep)

    @staticmethod
    def backward(ctx, g):
        a, b, keep = ctx.saved_tensors
        zero = torch.zeros((), dtype=g.dtype, device=g.device)
        with _backward_guard(g.dtype):
            with _plain_cpu_gemm(g):
                da = torch.where(keep, torch.matmul(g, b.transpose(-1, -2)), zero) if ctx.needs_input_grad[0] else None
            db = _absent_matmul(a.transpose(-1, -2), g, keep.transpose(0, 1)) if ctx.needs_input_grad[1] else None
        return da, db, None


class MaskedScores(torch.autograd.Function):
    """Causal attention scores ``q kᵀ * scale`` with the masked entries absent.

    q [..., M, D], k [..., N, D], keep [M, N] bool, scale float -> [..., M, N]: ``-inf`` where
    ``keep`` is False; where it is True the FP32 score, except that a score of ``-inf`` (only a
    non-finite q or k, or an FP32 overflow, makes one) is NaN, so a non-finite key cannot silently
    get weight 0 (docs/declared-semantics.md). Backward, with ``gs = g * scale`` zeroed where
    ``keep`` is False: ``dq = _absent_matmul(gs, k, keep)`` and ``dk = (qᵀ gs)ᵀ`` with the same
    rule, so a key a query cannot see never meets that query's gradient and a masked NaN/inf key
    or query reaches no one's gradient. In-place on its own temporaries: the memory of the plain
    ``masked_fill(q @ kᵀ * scale, -inf)``.
    """

    @staticmethod
    def forward(ctx, q, k, keep, scale):
        ctx.save_for_backward(q, k, keep)
        ctx.scale = scale
        with _plain_cpu_gemm(q):
            s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        s.masked_fill_(s == float("-inf"), float("nan"))
        return s.masked_fill_(~keep, float("-inf"))

    @staticmethod
    def backward(ctx, g):
        q, k, keep = ctx.saved_tensors
        gs = (g * ctx.scale).masked_fill_(~keep, 0.0)
        with _backward_guard(g.dtype):
            dq = _absent_matmul(gs, k, keep, a_masked=True) if ctx.needs_input_grad[0] else None
            dk = (_absent_matmul(gs.transpose(-1, -2), q, keep.transpose(0, 1), as_transpose=True, a_masked=True)
                  if ctx.needs_input_grad[1] else None)
        return dq, dk, None, None


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
    scores = MaskedScores.apply(qh, kh, mask, scale)  # [H, Lq, Lk] FP32, -inf where masked
    has_key = mask.any(dim=1)  # [Lq]
    if bool(has_key.all()):  # always so when Lq <= Lk; skipping the identities below saves memory
        probs = torch.softmax(scores, dim=-1)
    else:
        # Rows with no visible key get finite dummy scores (so no NaN reaches autograd) and are zeroed.
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
