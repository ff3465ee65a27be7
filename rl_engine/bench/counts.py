"""FLOP and byte counts of the benchmarked ops: exact integers from the shapes.

FLOPs count one multiply-add as 2 and only the matrix products (the work that decides the rate);
bytes are the fewest a kernel must move through device memory: every input read once, every
output written once, in its storage dtype. Ours and the baseline of one row share the same counts,
so a ratio of rates is the inverse ratio of times; the counts only give the absolute TFLOP/s and
GB/s their meaning (METHOD "two numbers first").

Shape glossary: T tokens, E hidden, F ffn, H / Hkv query / KV heads, D head dim, V vocab,
M / N / K GEMM sizes, B decode batch, L cached keys per sequence.
"""

from __future__ import annotations

BF16 = 2
FP32 = 4
INT32 = 4
INT64 = 8


def gemm_flops(m: int, n: int, k: int) -> int:
    """``[M, K] @ [K, N]``: ``2 * M * N * K``."""
    return 2 * m * n * k


def gemm_bytes(m: int, n: int, k: int, out_bytes: int = BF16) -> int:
    """BF16 operands read once, the ``[M, N]`` result written once in ``out_bytes`` per element."""
    return BF16 * (m * k + k * n) + out_bytes * m * n


def causal_pairs(lq: int, lk: int) -> int:
    """Visible (query, key) pairs of one causal sequence with queries aligned to the end of the
    keys: query ``i`` sees ``lk - lq + i + 1`` keys, so ``lq * (lk - lq) + lq * (lq + 1) / 2``."""
    if lq > lk:
        raise ValueError(f"lq={lq} > lk={lk}")
    return lq * (lk - lq) + lq * (lq + 1) // 2


def attention_flops(pairs: int, heads: int, head_dim: int, backward: bool = False) -> int:
    """Per visible pair and head: ``S = q k`` and ``O += p v`` are 2 * D each (forward 4 * D);
    backward adds the recomputed ``S``, ``dV``, ``dP``, ``dQ`` and ``dK`` (5 * 2 * D), so
    forward + backward is 14 * D (the FlashAttention-2 convention: backward = 2.5 x forward)."""
    per_pair = 14 if backward else 4
    return per_pair * pairs * heads * head_dim


def attention_prefill_bytes(t: int, heads: int, kv_heads: int, head_dim: int, backward: bool = False) -> int:
    """One sequence of ``t`` tokens. Forward: read q, k, v, write o. Forward + backward adds: read
    q, k, v, o, do and write dq, dk, dv (the LSE and cu_seqlens are negligible and not counted)."""
    q = t * heads * head_dim * BF16
    kv = t * kv_heads * head_dim * BF16
    fwd = 2 * q + 2 * kv
    if not backward:
        return fwd
    bwd = 3 * q + 2 * kv + q + 2 * kv  # read q, o, do, k, v; write dq, dk, dv
    return fwd + bwd


def attention_decode_flops(batch: int, context: int, heads: int, head_dim: int) -> int:
    """One query per sequence against ``context`` cached keys: ``4 * B * L * H * D``."""
    return 4 * batch * context * heads * head_dim


def attention_decode_bytes(batch: int, context: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Read q ``[B, H, D]``, the visible K and V cache ``[B, L, Hkv, D]`` each, ``cache_seqlens``
    ``[B]`` int32; write o ``[B, H, D]``."""
    q = batch * heads * head_dim * BF16
    kv = 2 * batch * context * kv_heads * head_dim * BF16
    return 2 * q + kv + batch * INT32


def rms_norm_bytes(t: int, e: int) -> int:
    """Read x ``[T, E]`` and weight ``[E]``, write y ``[T, E]`` (BF16)."""
    return BF16 * (2 * t * e + e)


def rope_bytes(t: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """RoPE on q ``[T, H, D]`` and k ``[T, Hkv, D]``: read and write both (BF16) and read the FP32
    cos and sin tables ``[T, D/2]`` once."""
    qk = t * (heads + kv_heads) * head_dim
    return 2 * BF16 * qk + 2 * FP32 * t * (head_dim // 2)


def swiglu_bytes(t: int, f: int) -> int:
    """Read gate and up ``[T, F]``, write ``[T, F]`` (BF16)."""
    return 3 * BF16 * t * f


def silu_bytes(t: int, f: int) -> int:
    """Read x ``[T, F]``, write ``[T, F]`` (BF16)."""
    return 2 * BF16 * t * f


def lm_head_flops(t: int, e: int, v: int) -> int:
    """``hidden [T, E] @ weight[V, E]^T``: ``2 * T * V * E``."""
    return gemm_flops(t, v, e)


def lm_head_bytes(t: int, e: int, v: int) -> int:
    """Read hidden and weight (BF16), write FP32 logits ``[T, V]``."""
    return gemm_bytes(t, v, e, out_bytes=FP32)


def linear_logp_flops(t: int, e: int, v: int, backward: bool = True) -> int:
    """Forward: the logits GEMM ``2 * T * V * E``; backward: ``dhidden = dlogits @ W`` and
    ``dweight = dlogits^T @ hidden``, ``4 * T * V * E``. A recompute of the logits in backward is
    the implementation's choice and not counted (the same count for every implementation)."""
    fwd = 2 * t * v * e
    return fwd + (4 * t * v * e if backward else 0)


def linear_logp_bytes(t: int, e: int, v: int, backward: bool = True) -> int:
    """Forward: read hidden, weight, targets (int64), write the FP32 logprobs ``[T]``. Backward:
    read hidden, weight, targets, the FP32 upstream gradient ``[T]``, write dhidden ``[T, E]`` and
    dweight ``[V, E]`` (BF16). No ``[T, V]`` tensor is counted: the fused op never stores one."""
    fwd = BF16 * (t * e + v * e) + INT64 * t + FP32 * t
    if not backward:
        return fwd
    bwd = BF16 * (t * e + v * e) + INT64 * t + FP32 * t + BF16 * (t * e + v * e)
    return fwd + bwd
