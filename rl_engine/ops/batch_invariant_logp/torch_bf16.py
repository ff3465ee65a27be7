"""``batch_invariant_logp`` as naive Hugging Face-style code runs it: the log-softmax in BF16.

The relative-criterion baseline (contract ``relative_criterion``), not a recommended path.
"""

import torch


def batch_invariant_logp_torch_bf16(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """logits: [B, S, V] float32, targets: [B, S] int64, mask: [B, S] bool -> [B, S] float32.

    ``torch.log_softmax(logits.bfloat16() / temperature, -1).gather(...)`` in BF16, masked to 0,
    then ``.float()``.
    """
    safe_targets = torch.where(mask, targets, torch.zeros_like(targets))
    logprobs = torch.log_softmax(logits.bfloat16() / temperature, dim=-1)
    picked = logprobs.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)
    return torch.where(mask, picked, torch.zeros((), dtype=picked.dtype, device=picked.device)).float()
