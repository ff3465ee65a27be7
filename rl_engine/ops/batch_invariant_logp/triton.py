"""Triton ``batch_invariant_logp``: the padded-layout ``[B, S, V]`` counterpart of ``logp``.

It launches ``logp``'s kernels (same ``BLOCK_V``, same warps, same FP32 online max / sum-exp) on
the ``B * S`` rows through a two-level row index with strides, so a row's logprob is bitwise equal
to ``logp`` on the same row, whatever B, S, the padding side or the memory layout. Rows whose mask
is False are not read at all (their logits may hold anything, NaN included; their targets are
neither validated nor used) and return exactly 0; their dlogits rows are exactly 0.
"""

from __future__ import annotations

import torch

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import check_triton_device
from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.logp.triton import BLOCK_V, backward_rows, check_temperature, forward_rows


def _check_inputs(logits, targets, mask, temperature) -> float:
    check_tensor("logits", logits, dtype=torch.float32, ndim=3, contiguous_last=True)
    b, s, v = logits.shape
    check_tensor("targets", targets, dtype=torch.int64, shape=(b, s))
    check_tensor("mask", mask, dtype=torch.bool, shape=(b, s))
    check_same_device(logits=logits, targets=targets, mask=mask)
    if v < 1:
        raise InputError(f"logits: the vocabulary axis V is empty (shape {list(logits.shape)})")
    tau = check_temperature(temperature)
    if targets.numel():
        bad = mask & ((targets < 0) | (targets >= v))
        if bool(bad.any()):
            bi, si = (int(i) for i in torch.nonzero(bad)[0])
            raise InputError(
                f"targets: id {int(targets[bi, si])} at position [{bi}, {si}] (mask True) is outside [0, {v})"
            )
    return tau


class _BatchInvariantLogpTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, mask, temperature):
        b, s, _ = logits.shape
        out, rmax, rlog = forward_rows(logits, targets, mask, temperature, BLOCK_V)
        ctx.save_for_backward(logits, targets, mask, rmax, rlog)
        ctx.temperature = temperature
        return out.view(b, s)

    @staticmethod
    def backward(ctx, g):
        logits, targets, mask, rmax, rlog = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        dx = backward_rows(logits, targets, mask, g, rmax, rlog, ctx.temperature, BLOCK_V)
        return dx, None, None, None


def batch_invariant_logp_triton(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Padded-layout target logprobs. logits: [B, S, V] float32, targets: [B, S] int64,
    mask: [B, S] bool -> [B, S] float32, exactly 0 where mask is False.

    ``out[b, s] = log_softmax(logits[b, s] / temperature)[targets[b, s]]`` where ``mask[b, s]``.
    FP32 logits (never rounded to BF16), FP32 max / sum-exp over fixed V tiles in increasing order,
    FP32 output (contract ``declared_exceptions.logits_for_scoring``; pitfalls P4, P11). Each row is
    bitwise equal to ``logp_triton`` on that row, independent of B, S, padding and strides.
    Targets at masked positions are neither validated nor used (e.g. -100 is fine there); logits
    at masked positions are never read. Backward: dlogits [B, S, V] float32, zero rows where mask is
    False. ``logits`` may have any strides on B and S (unit stride on V); targets and mask any.

    Raises
    ------
    InputError
        Wrong dtype / rank / shape, V = 0, tensors on different devices, an unmasked target
        outside [0, V), or a temperature that is not a finite number > 0.
    BackendUnavailable
        The tensors are not on a CUDA device (and the Triton interpreter is off).
    """
    tau = _check_inputs(logits, targets, mask, temperature)
    check_triton_device(logits, targets, mask)
    return _BatchInvariantLogpTriton.apply(logits, targets, mask, tau)
