"""FP32 reference for ``logp`` (WS1 §3.1): ``log_softmax(logits / temperature)[target]``.

Math: the softmax / log-sum-exp definition; PyTorch's ``log_softmax`` subtracts the row max before
the sum-exp. Everything is FP32 under :func:`fp32_reference_guard`.
"""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def logp_reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits: [T, V] float32, targets: [T] int64 -> [T] float32 (FP32 log-softmax, then gather)."""
    require_fp32(logits=logits)
    with fp32_reference_guard():
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
