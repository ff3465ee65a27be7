"""Attention, the op's one path: input checks (``_checks.py``, shared with the reference and
``torch_bf16`` paths), the torch ops ``rl_engine::attention_fwd`` / ``rl_engine::attention_bwd``
(varlen prefill and teacher forcing, fake shapes and autograd registered) and
``rl_engine::attention_decode`` (KV-cache decode, inference only), the per-backend entry points the
op spec lists, and the public :func:`attention` and :func:`attention_decode`. Kernels and
launchers: ``triton.py``, ``cuda.py`` (see their module notes for the tiling and the masking).

The varlen launch plan (the number of sequences and the longest query / key run) is host data
read once from ``cu_seqlens`` by :func:`~rl_engine.ops.attention._checks.check_varlen` and handed to
the torch ops as ints; a caller that keeps the :class:`VarlenPlan` can pass it back (``plan=``)
and the call reads no device values. Decode reads none with ``validate=False``.
"""

from __future__ import annotations

import torch

from rl_engine.errors import BackendUnavailable, InputError
from rl_engine.ops._torch_op import call, check_device, grad_bf16, launchers, register_autograd, run
from rl_engine.ops.attention._checks import LaunchPlan, VarlenPlan, check_decode, check_varlen, check_varlen_planned


def _check_head_dim(d: int, backend: str) -> None:
    supported = getattr(launchers("attention", backend), "HEAD_DIMS", None)
    if supported is not None and d not in supported:
        raise InputError(f"head dim D={d} has no {backend} kernel; supported: {', '.join(map(str, supported))}")


# ------------------------------------------------------------------------------- torch ops
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                  scale: float, batch: int, max_lq: int, max_lk: int, block_n: int,
                  backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [Tq, H, D] bf16, lse [H, Tq] fp32) of a validated varlen call; ``block_n`` 0 is the
    backend's KV block (another value only in the Triton negative control)."""
    return launchers("attention", backend).attention_fwd(q, k, v, cu_q, cu_k, scale, LaunchPlan(batch, max_lq, max_lk),
                                                         block_n=block_n)


attention_fwd = torch.library.custom_op("rl_engine::attention_fwd", _attention_fwd, mutates_args=())


@attention_fwd.register_fake
def _(q, k, v, cu_q, cu_k, scale, batch, max_lq, max_lk, block_n, backend):
    tq, h, _ = q.shape
    return q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty((h, tq), dtype=torch.float32)


@torch.library.custom_op("rl_engine::attention_bwd", mutates_args=())
def attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, scale: float, batch: int, max_lq: int,
                  max_lk: int, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq [Tq, H, D], dk [Tk, Hkv, D], dv [Tk, Hkv, D]) bf16, deterministic."""
    return launchers("attention", backend).attention_bwd(q, k, v, out, lse, do, cu_q, cu_k, scale,
                                                         LaunchPlan(batch, max_lq, max_lk))


@attention_bwd.register_fake
def _(q, k, v, out, lse, do, cu_q, cu_k, scale, batch, max_lq, max_lk, backend):
    return (q.new_empty(q.shape, dtype=torch.bfloat16), k.new_empty(k.shape, dtype=torch.bfloat16),
            k.new_empty(k.shape, dtype=torch.bfloat16))


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, scale, batch, max_lq, max_lk, _block_n, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.scale, ctx.plan, ctx.backend = scale, (batch, max_lq, max_lk), backend


def _backward(ctx, do, _grad_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = call(attention_bwd, q, k, v, out, lse, grad_bf16(do), cu_q, cu_k, ctx.scale, *ctx.plan, ctx.backend)
    return dq, dk, dv, None, None, None, None, None, None, None, None


register_autograd(attention_fwd, _attention_fwd, _backward, _setup)


def _attention_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                        scale: float, backend: str) -> torch.Tensor:
    """out [B, H, D] bf16 of one validated decode step (no autograd: inference only)."""
    return launchers("attention", backend).attention_decode_fwd(q, k_cache, v_cache, cache_seqlens, scale)


attention_decode_op = torch.library.custom_op("rl_engine::attention_decode", _attention_decode_op, mutates_args=())


@attention_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, scale, backend):
    return q.new_empty(q.shape, dtype=torch.bfloat16)


# ---------------------------------------------------------------------------- entry points
def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, backend: str, plan: VarlenPlan | None,
               block_n: int = 0) -> torch.Tensor:
    if plan is None:
        plan = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=torch.bfloat16, kernel=True)
    else:
        plan = check_varlen_planned(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, plan, dtype=torch.bfloat16,
                                    kernel=True)
    _check_head_dim(q.shape[2], backend)
    check_device(backend, q, k, v, cu_seqlens_q, cu_seqlens_k)
    return run(attention_fwd, _attention_fwd, q, k, v, cu_seqlens_q, cu_seqlens_k, float(scale), plan.batch,
               plan.max_lq, plan.max_lk, block_n, backend)[0]


def attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    *,
    backend: str,
    plan: VarlenPlan | None = None,
) -> torch.Tensor:
    """Causal varlen GQA attention on a kernel backend (forward and backward).

    q [Tq, H, D], k/v [Tk, Hkv, D] bfloat16 with unit stride on D (token / head strides free, so
    views of a fused qkv buffer work); cu_seqlens_q / cu_seqlens_k int32 [B+1] on the same device
    -> [Tq, H, D] bfloat16. Query ``i`` of sequence ``b`` sits at position ``Lk - Lq + i`` and sees
    keys ``0 .. Lk - Lq + i``; query head ``h`` uses KV head ``h // (H / Hkv)``. FP32 scores,
    softmax and accumulation, one rounding to BF16 (the Triton kernel rounds the probabilities to
    BF16 for the P·V product, as FlashAttention does; the CUDA kernel keeps them FP32). Backward:
    dq [Tq, H, D], dk / dv [Tk, Hkv, D] bfloat16, deterministic (no atomics). Math: Vaswani et al.
    2017; online softmax and backward of FlashAttention-2 (Dao 2023). Masked means absent
    (docs/declared-semantics.md): k / v of keys a query cannot see (future keys, other sequences)
    and q / dO of queries that cannot see a key take no part in that query's output or that key's
    gradients, so NaN / inf there changes nothing (bitwise). A non-finite q or visible k makes the
    row NaN, a visible non-finite v component makes that output component non-finite (NaN or inf).

    ``plan``: the :class:`VarlenPlan` that ``check_varlen`` returned for these very tensors; given,
    cu_seqlens are not read again (no host synchronisation; the caller answers for their values),
    while every other check runs and the plan is checked against the tensors' shapes
    (``check_varlen_planned``).

    Raises
    ------
    InputError
        Wrong dtype, shape or device, non-unit stride on D, D not a power of two >= 16 (cuda_bf16:
        not in {16, 32, 64, 128, 256}), ``H % Hkv != 0``, malformed cu_seqlens, or ``Lq > Lk`` for
        a sequence.
    BackendUnavailable
        ``triton_cuda_bf16``: tensors not on a CUDA device (and the Triton interpreter is off).
        ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, backend, plan)


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, scale: float, *,
                     plan: VarlenPlan | None = None) -> torch.Tensor:
    """:func:`attention_kernel` on ``triton_cuda_bf16`` (``plan`` as there)."""
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, "triton_cuda_bf16", plan)


def attention_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, scale: float, *,
                   plan: VarlenPlan | None = None) -> torch.Tensor:
    """:func:`attention_kernel` on ``cuda_bf16`` (``plan`` as there)."""
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, "cuda_bf16", plan)


def attention_triton_size_dependent_kv_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """NEGATIVE CONTROL, never a backend: the KV block size depends on the sequence lengths.

    ``BLOCK_N = 16`` when every sequence has at most 16 queries (decode steps, small chunks),
    else the normal ``BLOCK_N``: a "smaller tiles for short calls" heuristic. A decode step then
    splits the keys into other blocks than the prefill, so the online softmax rescales at other
    points and the bits change; the ``chunk`` invariance check must catch it.
    """
    plan = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=torch.bfloat16, kernel=True)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, "triton_cuda_bf16", plan,
                      block_n=16 if plan.max_lq <= 16 else 0)


def attention_decode_kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
    *,
    backend: str,
    validate: bool = True,
) -> torch.Tensor:
    """One decode step against a static KV cache on a kernel backend (inference only, no gradient).

    q [B, H, D], k_cache / v_cache [B, S_max, Hkv, D] bfloat16 (unit stride on D, other strides
    free), cache_seqlens int32 [B] in [0, S_max] -> [B, H, D] bfloat16. Query ``b`` sees cache
    slots ``0 .. cache_seqlens[b] - 1`` (the caller has written the current token's k/v at slot
    ``cache_seqlens[b] - 1``); slots past it are never read. ``cache_seqlens[b] == 0`` gives 0.
    Bitwise equal to the same query's row of :func:`attention_kernel` in a full prefill on the
    same backend (same KV block size and order, same per-row code). Masked means absent: NaN / inf
    in the slots past ``cache_seqlens[b]`` changes nothing; a visible one makes the outputs it
    reaches non-finite (docs/declared-semantics.md). ``validate=False`` skips the cache_seqlens
    range check (it reads device values) so the step can be captured in a CUDA graph; the caller
    then guarantees the range.

    Raises
    ------
    InputError
        Wrong dtype, shape or device, non-unit stride on D, D not a power of two >= 16 (cuda_bf16:
        not in {16, 32, 64, 128, 256}), ``H % Hkv != 0``, cache_seqlens outside [0, S_max] (with
        ``validate``), or inputs that require grad while grad mode is on (decode is inference
        only).
    BackendUnavailable
        As :func:`attention_kernel`.
    """
    check_decode(q, k_cache, v_cache, cache_seqlens, scale, dtype=torch.bfloat16, kernel=True, validate=validate)
    _check_head_dim(q.shape[2], backend)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        raise InputError("attention_decode is inference only: call it under torch.no_grad() or on tensors "
                         "that do not require grad")
    check_device(backend, q, k_cache, v_cache, cache_seqlens)
    return run(attention_decode_op, _attention_decode_op, q, k_cache, v_cache, cache_seqlens, float(scale), backend)


def attention_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_seqlens: torch.Tensor, scale: float, *, validate: bool = True) -> torch.Tensor:
    """:func:`attention_decode_kernel` on ``triton_cuda_bf16``."""
    return attention_decode_kernel(q, k_cache, v_cache, cache_seqlens, scale, backend="triton_cuda_bf16",
                                   validate=validate)


def attention_decode_cuda(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          cache_seqlens: torch.Tensor, scale: float, *, validate: bool = True) -> torch.Tensor:
    """:func:`attention_decode_kernel` on ``cuda_bf16``."""
    return attention_decode_kernel(q, k_cache, v_cache, cache_seqlens, scale, backend="cuda_bf16",
                                   validate=validate)
