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

Each row's logprob and dhidden depend only on that row, so batch invariance holds by
construction. Scratch memory: [T, 4096] FP32 (plus [T, E] FP32 when V > 4096).
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch
from rl_engine.ops.lm_head.cuda import gemm_f32_out, gemm_fp32_math
from rl_engine.ops.logp.cuda import chunk_v


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
    part_t = torch.empty(t, dtype=torch.float32, device=dev)
    for c, v0, v1 in chunks:
        view = buf[:, : v1 - v0]
        gemm_f32_out(hidden, weight[v0:v1].t(), out=view)
        launch(dev, "rl_logp_partial", view, t, 1, view.stride(0), 0, v0, v, c, 1, n_chunks, float(temperature),
               targets, targets.stride(0), 0, None, 0, 0, part_m, part_s, part_t)
    launch(dev, "rl_logp_finish", part_m, part_s, part_t, t, 1, n_chunks, None, 0, 0, out, rmax, rlog)
    return out, rmax, rlog


def linear_logp_bwd(hidden, weight, targets, g, rmax, rlog, temperature, need_dh, need_dw):
    """(dhidden [T, E] or None, dweight [V, E] or None) bf16 from the upstream g [T] FP32."""
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
    # Every element of dh (single chunk) and dw is written by exactly one kernel thread.
    dh = torch.empty((t, e), dtype=torch.bfloat16, device=dev) if (need_dh and single) else None
    dw = torch.empty((v, e), dtype=torch.bfloat16, device=dev) if need_dw else None
    dh_acc = torch.zeros((t, e), dtype=torch.float32, device=dev) if (need_dh and not single) else None
    buf = torch.empty((t, min(chunk_v(), v)), dtype=torch.float32, device=dev)
    for _, v0, v1 in chunks:
        view = buf[:, : v1 - v0]
        w_c = weight[v0:v1]
        gemm_f32_out(hidden, w_c.t(), out=view)
        launch(dev, "rl_logp_bwd", view, view.stride(0), 0, view, view.stride(0), 0, t, 1, v0, v1 - v0,
               float(temperature), targets, targets.stride(0), 0, None, 0, 0, g, rmax, rlog)
        if need_dh:
            if single:
                gemm_fp32_math(view, w_c, torch.bfloat16, out=dh)
            else:
                gemm_fp32_math(view, w_c, torch.float32, out=dh_acc, accumulate=True)
        if need_dw:
            gemm_fp32_math(view.t(), hidden, torch.bfloat16, out=dw[v0:v1])
    if dh_acc is not None:
        dh = dh_acc.to(torch.bfloat16)
    return dh, dw
