"""Public entry points of ``attention``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.attention.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import check_backend, resolve_impl
from rl_engine.ops.attention.op import *  # noqa: F401,F403 - the op's public names


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    *,
    backend: str = "triton_cuda_bf16",
) -> torch.Tensor:
    """Causal varlen GQA attention.

    q [Tq, H, D], k/v [Tk, Hkv, D] bfloat16 (float32 for ``reference_fp32``); cu_seqlens_q /
    cu_seqlens_k int32 [B+1] -> [Tq, H, D] in the input dtype. Query ``i`` of sequence ``b``
    (``Lq`` queries, ``Lk >= Lq`` keys) sits at position ``Lk - Lq + i`` and sees keys
    ``0 .. Lk - Lq + i``: ``Lq == Lk`` is packed prefill / teacher forcing, ``Lq < Lk`` a chunk of
    queries against a longer prefix, ``Lq == 1`` a decode step. Query head ``h`` uses KV head
    ``h // (H / Hkv)``. Scores, row max, sum-exp and the output accumulator in FP32; the Triton
    kernel rounds the probabilities to BF16 for the P·V tensor-core product (as FlashAttention
    does), the CUDA kernel keeps them FP32. A row with no visible key is exactly 0.
    Differentiable in q, k, v. Masked means absent (docs/declared-semantics.md): k / v of keys a query cannot see (future
    keys, other sequences) and q / dO of queries that cannot see a key take no part in that
    query's output or that key's gradients, so NaN / inf there changes nothing (bitwise). A
    non-finite q or visible k makes the row NaN, a visible non-finite v component makes that
    output component non-finite (NaN or inf).

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why. On the kernel
    backends, bad input raises InputError before any launch (``torch_bf16`` and
    ``reference_fp32`` are unvalidated comparison paths, docs/ops-api.md); see
    :func:`attention_kernel`.
    """
    return resolve_impl("attention", backend)(
        q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale
    )

def attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
    *,
    backend: str = "triton_cuda_bf16",
) -> torch.Tensor:
    """One decode step against a static KV cache (inference only).

    q [B, H, D], k_cache / v_cache [B, S_max, Hkv, D] bfloat16 (float32 for ``reference_fp32``),
    cache_seqlens int32 [B] in [0, S_max] -> [B, H, D]. Query ``b`` sees cache slots
    ``0 .. cache_seqlens[b] - 1`` (the current token's k/v already written at slot
    ``cache_seqlens[b] - 1``); ``cache_seqlens[b] == 0`` gives exactly 0. On
    ``triton_cuda_bf16`` the result is bitwise equal to the same query's row of :func:`attention`.
    Masked means absent: NaN / inf in the slots past ``cache_seqlens[b]`` changes nothing; a
    visible one makes the outputs it reaches non-finite (docs/declared-semantics.md).
    """
    from rl_engine.ops.attention.spec import DECODE_IMPLS

    check_backend(backend)
    if backend not in DECODE_IMPLS:
        raise BackendUnavailable(f"op attention_decode has no {backend} implementation")
    return DECODE_IMPLS[backend](q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, scale=scale)
