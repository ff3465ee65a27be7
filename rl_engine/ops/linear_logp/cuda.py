"""CUDA C++ fused linear log-probabilities (``cuda_bf16`` backend):
``log_softmax((hidden @ weight.T) / temperature)[target]`` without a ``[T, V]`` logits buffer.

The V axis is processed in the fixed chunks of ``logp`` (``rl_logp_chunk_v() = 4096`` entries, a
function of V only), in increasing chunk order, through one ``[T, 4096]`` FP32 scratch buffer:

Forward, per chunk: the logits chunk is computed by the lm_head GEMM (``rl_gemm_bf16_f32out``: BF16
WMMA tiles, one FP32 accumulator over E in increasing order, FP32 out, never rounded to BF16;
contract ``declared_exceptions.logits_for_scoring``, pitfall P5), then ``rl_logp_partial`` records
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

from rl_engine.backends.cuda_launch import check_cuda_device, launch
from rl_engine.errors import InputError
from rl_engine.ops._validate import check_index_range, check_same_device, check_tensor
from rl_engine.ops.lm_head.cuda import gemm_f32_out, gemm_fp32_math
from rl_engine.ops.logp.cuda import chunk_v
from rl_engine.ops.logp.triton import check_temperature


def _chunks(v: int) -> list[tuple[int, int, int]]:
    cv = chunk_v()
    return [(c, c * cv, min(v, (c + 1) * cv)) for c in range(-(-v // cv))]


def _forward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
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


def _backward(hidden, weight, targets, g, rmax, rlog, temperature, need_dh, need_dw):
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


class _LinearLogpCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature):
        out, rmax, rlog = _forward(hidden, weight, targets, temperature)
        ctx.save_for_backward(hidden, weight, targets, rmax, rlog)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, g):
        hidden, weight, targets, rmax, rlog = ctx.saved_tensors
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_dh or need_dw):
            return None, None, None, None
        dh, dw = _backward(hidden, weight, targets, g, rmax, rlog, ctx.temperature, need_dh, need_dw)
        return dh, dw, None, None


def linear_logp_cuda(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     temperature: float = 1.0) -> torch.Tensor:
    """Fused LM head + log-softmax + gather, CUDA C++. hidden: [T, E] bfloat16, weight: [V, E]
    bfloat16, targets: [T] int64 -> [T] float32; no [T, V] buffer in forward or backward.

    ``out[t] = log_softmax((hidden[t] @ weight.T) / temperature)[targets[t]]``. The logits are the
    FP32 accumulator of BF16 tensor-core products, never rounded to BF16; max, sum-exp and the
    output are FP32 (contract ``declared_exceptions.logits_for_scoring``; pitfalls P4, P5, P11);
    bitwise equal to ``logp_cuda(lm_head_cuda(hidden, weight), targets, temperature)``. Backward:
    dhidden [T, E] and dweight [V, E] bfloat16 from FP32 dlogits chunks, FP32 math, fixed order,
    one rounding; scratch [T, 4096] FP32 (plus [T, E] FP32 when V > 4096). No atomics.

    Raises
    ------
    InputError
        hidden / weight not 2-D bfloat16 with unit stride on E, mismatched E, E or V = 0, targets
        not int64 [T] on the same device, a target outside [0, V), or a temperature that is not a
        finite number > 0.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("hidden", hidden, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    t, e = hidden.shape
    check_tensor("weight", weight, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if weight.shape[1] != e:
        raise InputError(f"weight: expected shape [V, {e}] (E of hidden), got {list(weight.shape)}")
    check_tensor("targets", targets, dtype=torch.int64, shape=(t,))
    check_same_device(hidden=hidden, weight=weight, targets=targets)
    v = weight.shape[0]
    if v < 1 or e < 1:
        raise InputError(f"weight: V and E must be >= 1, got shape {list(weight.shape)}")
    tau = check_temperature(temperature)
    check_index_range("targets", targets, v)
    check_cuda_device(hidden, weight, targets)
    return _LinearLogpCuda.apply(hidden, weight, targets, tau)
