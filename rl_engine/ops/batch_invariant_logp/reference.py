"""FP32 reference for ``batch_invariant_logp`` (WS1 §3.1): masked ``log_softmax(logits / T)[target]``.

Masked rows are replaced by zeros before the log-softmax (so junk there cannot leak NaN into the
gradient) and their output is 0; their targets are replaced by 0 before the gather.
"""

import torch

from rl_engine.ops.logp.reference import fp32_log_softmax
from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def batch_invariant_logp_reference(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """logits: [B, S, V] float32, targets: [B, S] int64, mask: [B, S] bool -> [B, S] float32."""
    require_fp32(logits=logits)
    with fp32_reference_guard():
        safe_logits = torch.where(mask.unsqueeze(-1), logits, torch.zeros((), dtype=logits.dtype, device=logits.device))
        safe_targets = torch.where(mask, targets, torch.zeros_like(targets))
        logprobs = fp32_log_softmax(safe_logits / temperature)
        picked = logprobs.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)
        return torch.where(mask, picked, torch.zeros((), dtype=picked.dtype, device=picked.device))
