"""CUDA C++ fused linear log-probabilities (``cuda_bf16`` backend):
``log_softmax((hidden @ weight.T) / temperature)[target]`` without a ``[T, V]`` logits buffer.

The V axis is processed in the fixed chunks of ``logp`` (``rl_logp_chunk_v() = 4096`` entries, a
function of V only), in increasing chunk order, through one ``[T, 4096]`` FP32 scratch buffer:

Forward, per chunk: the logits chunk is computed by the lm_head GEMM (``rl_gemm_bf16_f32out``: BF16
WMMA tiles, one FP32 accumulator over E in increasing order, FP32 out, never rounded to BF16;
contract ``declared_exceptions.logits_for_scoring``, ``docs/pitfalls.md`` P5), then ``rl_logp_partial`` records
that chunk's FP32 (max, sum-exp) per row and the target's logit; ``rl_logp_finish`` combines the
chunks in order: ``out = (z_t - m) - log(s)``. These are exactly the kernels of ``lm_head`` and
``logp``, so for the same inputs ``linear_logp`` equals ``logp(lm_head(hidden, weight))`` bit for
bit.

Backward, per chunk in increasing order: recompute the logits chunk (same GEMM), turn it in place
into ``dlogits = (onehot * g - p * g) / temperature`` (``rl_logp_bwd``, FP32), then on CUDA cores
with FP32 math (``rl_gemm_f32_simt``): ``dweight[chunk] = dlogits_chunk^T @ hidden`` (reduces T in
increasing order, rounded once) and ``dhidden += dlogits_chunk @ weight[chunk]`` (each chunk's FP32
product added to an FP32 [T, E] accumulator in chunk order, rounded once at the end; with a single
chunk the product is rounded directly). No atomics; every output element is owned by one thread.

Tensor-core backward (:data:`TENSOR_CORE_BWD_ON_CUDA`, the ``tensor_cores`` argument): the Triton
backend's scheme (``rl_engine/ops/linear_logp/triton.py``, kernels B and C) in CUDA. Each chunk's FP32
dlogits become a BF16 pair ``hi = bf16(d)``, ``lo = bf16(d - hi)`` (``rl_split_hilo``; 16 significant
bits, about 2^-17 relative), and ``rl_gemm_hilo`` (the pipelined tensor-core GEMM,
``tree_pipe_kernel``; with ``det_gemm.cuda`` form 3 the warpgroup one, ``tree_wgmma_kernel``, where its
layout holds) runs ``dhidden += hi @ w_chunk + lo @ w_chunk`` and ``dweight_chunk = hi^T @ hidden
+ lo^T @ hidden`` with one FP32 accumulator per element over :data:`GRAD_BLOCK`-wide reduction blocks
in increasing order, each block's hi product before its lo product (dhidden's accumulator carried
across chunks in an FP32 [T, E] buffer, rounded once after the last). The same sequence of products
per element as the Triton kernels (tested bit for bit against them in the CPU emulations, where
both add the exact products one at a time); needs E a multiple of 8 (otherwise the FP32 path runs,
a function of the model only). On by default since the H200 ran it (``evidence/2026-12-04-h200-issue33-e035223/``).

With ``logp.declared.DECLARED_LSE`` (off by default) the forward runs the declared sequence of the
Triton kernels instead (``rl_logp_tiled_partial`` per chunk: 128-column tiles with an online max /
sum whose tile sum is ``fragment_row_sum``'s order; ``rl_logp_tiled_finish``: Triton's combine),
and the backward's dlogits use ``tl.exp`` (``rl_logp_declared_bwd``): the logits are lm_head's (declared
bit-exact across backends), so the op then has the Triton backend's bits.

Each row's logprob and dhidden depend only on that row, so batch invariance holds by
construction. Scratch memory: [T, 4096] FP32 (plus [T, E] FP32 when V > 4096; plus two [T, 4096]
BF16 with tensor cores).
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch
from rl_engine.ops.lm_head.cuda import gemm_f32_out, gemm_fp32_math
from rl_engine.ops.logp import declared
from rl_engine.ops.logp.cuda import chunk_v


TENSOR_CORE_BWD_ON_CUDA = True
"""Whether :func:`linear_logp_bwd` runs its GEMMs on tensor cores (hi / lo pair, see the module
docstring) instead of on CUDA cores with FP32 operands (False: the FP32 path). On since the H200 ran it:
``test_linear_logp_tensor_core_backward_accuracy_and_invariance`` passed there."""

GRAD_BLOCK = 64
"""Reduction block of the tensor-core backward GEMMs: each block's hi product, then its lo product
(``HILO_BLOCK`` in ``gemm_pipe.cuh``; the Triton backend's ``GRAD_BLOCK``). Declared; never changed for speed."""


def _pipe_ready(x: torch.Tensor) -> bool:
    """Row-major with 16-byte aligned data and rows (what ``rl_gemm_hilo`` reads without a copy)."""
    return x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0


def _gemm_hilo(hi: torch.Tensor, lo: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
               acc_in: torch.Tensor | None) -> None:
    """``out = acc_in + (hi @ b + lo @ b per GRAD_BLOCK block)``: ``hi``, ``lo`` [M, K] BF16 with the same
    strides, ``b`` [K, N] BF16 N-contiguous, ``acc_in`` FP32 [M, N] row-major or None (0); ``out`` FP32
    (may be ``acc_in``) or BF16 (rounded once)."""
    m, k = hi.shape
    n = b.shape[1]
    launch(hi.device, "rl_gemm_hilo", hi, lo, b, out, acc_in, m, n, k, hi.stride(0), hi.stride(1), b.stride(0),
           b.stride(1), out.stride(0), out.stride(1), 0 if acc_in is None else acc_in.stride(0),
           int(out.dtype == torch.float32))


def _chunks(v: int) -> list[tuple[int, int, int]]:
    cv = chunk_v()
    return [(c, c * cv, min(v, (c + 1) * cv)) for c in range(-(-v // cv))]


def linear_logp_fwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
    """(logprobs, row max, log sum-exp) FP32 [T] of validated hidden [T, E], weight [V, E] bf16, targets [T]."""
    t = hidden.shape[0]
    v = weight.shape[0]
    dev = hidden.device
    out = torch.empty(t, dtype=torch.float32, device=dev)
    rmax = torch.empty(t, dtype=torch.float32, device=dev)
    rlog = torch.empty(t, dtype=torch.float32, device=dev)
    if t == 0:
        return out, rmax, rlog
    chunks = _chunks(v)
    n_chunks = len(chunks)
    buf = torch.empty((t, min(chunk_v(), v)), dtype=torch.float32, device=dev)
    part_m = torch.empty((t, n_chunks), dtype=torch.float32, device=dev)
    part_s = torch.empty((t, n_chunks), dtype=torch.float32, device=dev)
    if declared.DECLARED_LSE:  # per-chunk target logits, as the Triton kernels keep them
        part_t = torch.empty((t, n_chunks), dtype=torch.float32, device=dev)
        # (All rows per chunk: 2048-row passes, whose FP32 chunk could stay in L2, kept the bits but were
        # slower on an H100, 23.3 against 21.2 ms at 8192 tokens: evidence/2026-12-07-h100-chain-8c1568c/.)
        for c, v0, v1 in chunks:
            view = buf[:, : v1 - v0]
            gemm_f32_out(hidden, weight[v0:v1].t(), out=view)
            launch(dev, "rl_logp_tiled_partial", view, view.stride(0), v0, v, c, t, n_chunks, float(temperature),
                   targets, targets.stride(0), part_m, part_s, part_t)
        launch(dev, "rl_logp_tiled_finish", part_m, part_s, part_t, t, n_chunks, out, rmax, rlog)
        return out, rmax, rlog
    part_t = torch.empty(t, dtype=torch.float32, device=dev)
    for c, v0, v1 in chunks:
        view = buf[:, : v1 - v0]
        gemm_f32_out(hidden, weight[v0:v1].t(), out=view)
        launch(dev, "rl_logp_partial", view, t, 1, view.stride(0), 0, v0, v, c, 1, n_chunks, float(temperature),
               targets, targets.stride(0), 0, None, 0, 0, part_m, part_s, part_t)
    launch(dev, "rl_logp_finish", part_m, part_s, part_t, t, 1, n_chunks, None, 0, 0, out, rmax, rlog)
    return out, rmax, rlog


def linear_logp_bwd(hidden, weight, targets, g, rmax, rlog, temperature, need_dh, need_dw, tensor_cores=None):
    """(dhidden [T, E] or None, dweight [V, E] or None) bf16 from the upstream g [T] FP32.
    ``tensor_cores``: the hi / lo tensor-core GEMMs (None: :data:`TENSOR_CORE_BWD_ON_CUDA`)."""
    t, e = hidden.shape
    v = weight.shape[0]
    dev = hidden.device
    if t == 0:
        dh = torch.zeros((t, e), dtype=torch.bfloat16, device=dev) if need_dh else None
        dw = torch.zeros((v, e), dtype=torch.bfloat16, device=dev) if need_dw else None
        return dh, dw
    g = g.reshape(t).to(torch.float32).contiguous()
    chunks = _chunks(v)
    single = len(chunks) == 1
    tc = (TENSOR_CORE_BWD_ON_CUDA if tensor_cores is None else bool(tensor_cores)) and e % 8 == 0
    # Every element of dh (single chunk, or the tensor-core path's last chunk) and dw is written by
    # exactly one kernel thread.
    dh = torch.empty((t, e), dtype=torch.bfloat16, device=dev) if (need_dh and (single or tc)) else None
    dw = torch.empty((v, e), dtype=torch.bfloat16, device=dev) if need_dw else None
    dh_acc = None
    if need_dh and not single:
        dh_acc = (torch.empty if tc else torch.zeros)((t, e), dtype=torch.float32, device=dev)
    cv = min(chunk_v(), v)
    buf = torch.empty((t, cv), dtype=torch.float32, device=dev)
    if tc:
        hidden_tc = hidden if _pipe_ready(hidden) else hidden.contiguous()
        weight_tc = weight if _pipe_ready(weight) else weight.contiguous()
        hi = torch.empty((t, cv), dtype=torch.bfloat16, device=dev)
        lo = torch.empty_like(hi)
    for i, (_, v0, v1) in enumerate(chunks):
        view = buf[:, : v1 - v0]
        w_c = weight[v0:v1]
        gemm_f32_out(hidden, w_c.t(), out=view)
        launch(dev, "rl_logp_declared_bwd" if declared.DECLARED_LSE else "rl_logp_bwd", view, view.stride(0), 0, view,
               view.stride(0), 0, t, 1, v0, v1 - v0, float(temperature), targets, targets.stride(0), 0, None, 0, 0,
               g, rmax, rlog)
        if tc:
            launch(dev, "rl_split_hilo", view, view.stride(0), hi, lo, cv, t, v1 - v0)
            h_c, l_c = hi[:, : v1 - v0], lo[:, : v1 - v0]
            if need_dh:  # the FP32 accumulator: from 0, carried across chunks, rounded after the last
                last = i == len(chunks) - 1
                _gemm_hilo(h_c, l_c, weight_tc[v0:v1], dh if last else dh_acc, None if i == 0 else dh_acc)
            if need_dw:
                _gemm_hilo(h_c.t(), l_c.t(), hidden_tc, dw[v0:v1], None)
            continue
        if need_dh:
            if single:
                gemm_fp32_math(view, w_c, torch.bfloat16, out=dh)
            else:
                gemm_fp32_math(view, w_c, torch.float32, out=dh_acc, accumulate=True)
        if need_dw:
            gemm_fp32_math(view.t(), hidden, torch.bfloat16, out=dw[v0:v1])
    if dh_acc is not None and not tc:
        dh = dh_acc.to(torch.bfloat16)
    return dh, dw
