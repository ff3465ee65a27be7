"""``batch_invariant_logp`` as naive Hugging Face-style code runs it: the log-softmax in BF16.

The relative-criterion baseline (contract ``relative_criterion``), not a recommended path.
"""

import torch


def batch_invariant_logp_torch_bf16(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """logits: [B, S, V] float32, targets: [B, S] int64, mask: [B, S] bool -> [B, S] float32.

    ``torch.log_softmax(logits.bfloat16() / temperature, -1).gather(...)`` in BF16, masked to 0,
    then ``.float()``. Rows where mask is False are absent (docs/declared-semantics.md): their
    logits are replaced by 0 before the log-softmax, so NaN/inf there changes no output and no
    gradient; their dlogits are 0.
    """
    safe_targets = torch.where(mask, targets, torch.zeros_like(targets))
    # Masked rows are absent: their logits are replaced before the log-softmax, so a NaN/inf there
    # cannot reach the gradient (log_softmax's backward of a NaN row with a zero upstream is NaN).
    safe_logits = torch.where(mask.unsqueeze(-1), logits, torch.zeros((), dtype=logits.dtype, device=logits.device))
    logprobs = torch.log_softmax(safe_logits.bfloat16() / temperature, dim=-1)
    picked = logprobs.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)
    return torch.where(mask, picked, torch.zeros((), dtype=picked.dtype, device=picked.device)).float()
