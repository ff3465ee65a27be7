"""CUDA C++ ``batch_invariant_logp`` (``cuda_bf16`` backend): the padded-layout ``[B, S, V]``
counterpart of ``logp``.

It launches ``logp``'s kernels (same fixed V chunks, same threads, same FP32 online max / sum-exp;
see :mod:`rl_engine.ops.logp.cuda`) on the ``B * S`` rows through a two-level row index with
strides, so a row's logprob is bitwise equal to ``logp_cuda`` on the same row, whatever B, S, the
padding side or the memory layout. Rows whose mask is False are never read (their logits may hold
anything, NaN included; their targets are neither validated nor used) and return exactly 0; their
dlogits rows are exactly 0.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device
from rl_engine.ops.batch_invariant_logp.triton import _check_inputs
from rl_engine.ops.logp.cuda import backward_rows, forward_rows


class _BatchInvariantLogpCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, mask, temperature):
        b, s, _ = logits.shape
        out, rmax, rlog = forward_rows(logits, targets, mask, temperature)
        ctx.save_for_backward(logits, targets, mask, rmax, rlog)
        ctx.temperature = temperature
        return out.view(b, s)

    @staticmethod
    def backward(ctx, g):
        logits, targets, mask, rmax, rlog = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return backward_rows(logits, targets, mask, g, rmax, rlog, ctx.temperature), None, None, None


def batch_invariant_logp_cuda(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Padded-layout target logprobs, CUDA C++. logits: [B, S, V] float32, targets: [B, S] int64,
    mask: [B, S] bool -> [B, S] float32, exactly 0 where mask is False.

    ``out[b, s] = log_softmax(logits[b, s] / temperature)[targets[b, s]]`` where ``mask[b, s]``.
    FP32 logits (never rounded to BF16), FP32 max / sum-exp over fixed V chunks in a fixed order,
    FP32 output (contract ``declared_exceptions.logits_for_scoring``; pitfalls P4, P11). Each row
    is bitwise equal to ``logp_cuda`` on that row. Targets at masked positions are neither
    validated nor used; logits at masked positions are never read. Backward: dlogits [B, S, V]
    float32, zero rows where mask is False. ``logits`` may have any strides on B and S (unit
    stride on V); targets and mask any.

    Raises
    ------
    InputError
        Wrong dtype / rank / shape, V = 0, tensors on different devices, an unmasked target
        outside [0, V), or a temperature that is not a finite number > 0.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    tau = _check_inputs(logits, targets, mask, temperature)
    check_cuda_device(logits, targets, mask)
    return _BatchInvariantLogpCuda.apply(logits, targets, mask, tau)
