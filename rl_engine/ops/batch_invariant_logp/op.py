"""``batch_invariant_logp``, the op's one path: input checks, then the logprob torch ops of
:mod:`rl_engine.ops.logp.api` (``rl_engine::logp_rows_fwd`` / ``_bwd``) on the [B, S] rows of
padded logits with the mask; the per-backend entry points the op spec lists and the public
:func:`batch_invariant_logp`. The launchers are ``logp``'s (``logp/triton.py``, ``logp/cuda.py``),
so each row is bitwise equal to ``logp`` on that row.
"""

from __future__ import annotations

import torch

from rl_engine.errors import InputError
from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.logp.op import check_temperature, logp_rows


def check_inputs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: object,
                 validate: bool = True) -> float:
    """logits [B, S, V] float32 (unit stride on V, V >= 1), targets [B, S] int64, mask [B, S]
    bool, one device; every target where mask is True in [0, V) (only with ``validate``: it reads
    device values); temperature finite > 0. Returns the temperature as a float."""
    check_tensor("logits", logits, dtype=torch.float32, ndim=3, contiguous_last=True)
    b, s, v = logits.shape
    check_tensor("targets", targets, dtype=torch.int64, shape=(b, s))
    check_tensor("mask", mask, dtype=torch.bool, shape=(b, s))
    check_same_device(logits=logits, targets=targets, mask=mask)
    if v < 1:
        raise InputError(f"logits: the vocabulary axis V is empty (shape {list(logits.shape)})")
    tau = check_temperature(temperature)
    if validate and targets.numel():
        bad = mask & ((targets < 0) | (targets >= v))
        if bool(bad.any()):
            bi, si = (int(i) for i in torch.nonzero(bad)[0])
            raise InputError(
                f"targets: id {int(targets[bi, si])} at position [{bi}, {si}] (mask True) is outside [0, {v})"
            )
    return tau


def batch_invariant_logp_kernel(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                                temperature: float = 1.0, *, backend: str, validate: bool = True) -> torch.Tensor:
    """Padded-layout target logprobs on a kernel backend. logits: [B, S, V] float32, targets:
    [B, S] int64, mask: [B, S] bool -> [B, S] float32, exactly 0 where mask is False.

    ``out[b, s] = log_softmax(logits[b, s] / temperature)[targets[b, s]]`` where ``mask[b, s]``.
    FP32 logits (never rounded to BF16), FP32 max / sum-exp over fixed V tiles in a fixed order,
    FP32 output (contract ``declared_exceptions.logits_for_scoring``; ``docs/pitfalls.md``, P4 and
    P11). Each row is bitwise equal to ``logp`` on that row on the same backend, independent of B,
    S, padding and strides. Targets at masked positions are neither validated nor used (e.g. -100
    is fine there); logits at masked positions are never read. Backward: dlogits [B, S, V]
    float32, zero rows where mask is False. ``logits`` may have any strides on B and S (unit
    stride on V); targets and mask any. ``validate=False`` skips the target range check (it reads
    device values) for a capture-safe call.

    Raises
    ------
    InputError
        Wrong dtype / rank / shape, V = 0, tensors on different devices, an unmasked target
        outside [0, V) (with ``validate``), or a temperature that is not a finite number > 0.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    tau = check_inputs(logits, targets, mask, temperature, validate)
    b, s, _ = logits.shape
    return logp_rows(logits, targets, mask, tau, backend).view(b, s)


def batch_invariant_logp_triton(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                                temperature: float = 1.0) -> torch.Tensor:
    """:func:`batch_invariant_logp_kernel` on ``triton_cuda_bf16``."""
    return batch_invariant_logp_kernel(logits, targets, mask, temperature, backend="triton_cuda_bf16")


def batch_invariant_logp_cuda(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                              temperature: float = 1.0) -> torch.Tensor:
    """:func:`batch_invariant_logp_kernel` on ``cuda_bf16``."""
    return batch_invariant_logp_kernel(logits, targets, mask, temperature, backend="cuda_bf16")
