"""FP32 reference for ``logp`` (WS1 §3.1): ``log_softmax(logits / temperature)[target]``.

Math: the log-sum-exp definition with the row max subtracted, written out in FP32:
``(z - m) - log(sum(exp(z - m)))`` with ``m = max(z)``. Not ``torch.log_softmax``: on the CPU it
accumulated the sum-exp of a 151936-wide row so that ``docs/pitfalls.md`` P4's third case came out 4.9e-5 off
(-2.0665400 instead of -2.0665891, above the contract's FP32 logprob atol), while ``torch.sum``
(cascade summation on the CPU, a tree on the GPU) gives the correctly rounded value. Everything is
FP32 under :func:`fp32_reference_guard`.
"""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def fp32_log_softmax(z: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last axis, FP32 in and out: ``(z - m) - log(sum(exp(z - m)))``.

    ``m`` is the row max, detached (the result does not depend on it, so no gradient flows through
    it); the sum is ``torch.sum``. A row of -inf, or one holding +inf or NaN, gives NaN, as
    ``torch.log_softmax`` does. Differentiable: the gradient is ``g - softmax * sum(g)``.
    """
    m = z.detach().amax(dim=-1, keepdim=True)
    shifted = z - m
    return shifted - torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))


def logp_reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits: [T, V] float32, targets: [T] int64 -> [T] float32 (FP32 log-softmax, then gather)."""
    require_fp32(logits=logits)
    with fp32_reference_guard():
        logprobs = fp32_log_softmax(logits / temperature)
        return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
