"""``linear_logp`` as naive Hugging Face-style code runs it: BF16 logits, BF16 log-softmax.

The relative-criterion baseline (contract ``relative_criterion``), not a recommended path: the
BF16 logits alone move logprobs by up to 0.12 at logit scale 80 (``docs/pitfalls.md`` P5).
"""

import torch


def linear_logp_torch_bf16(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                           temperature: float = 1.0) -> torch.Tensor:
    """hidden: [T, E] bfloat16, weight: [V, E] bfloat16, targets: [T] int64 -> [T] float32.

    ``(hidden @ weight.T)`` in BF16, ``/ temperature`` and ``log_softmax`` in BF16, gather, ``.float()``.
    """
    logits = hidden @ weight.T
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
