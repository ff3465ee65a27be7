"""``logp`` as naive Hugging Face-style code runs it: the log-softmax in BF16.

This is the relative-criterion baseline (contract ``relative_criterion``), not a recommended path:
rounding the logits and the log-softmax to BF16 loses up to ~0.06 per logprob at V = 151936
(``docs/pitfalls.md`` P4, P5).
"""

import torch


def logp_torch_bf16(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits: [T, V] float32, targets: [T] int64 -> [T] float32.

    ``torch.log_softmax(logits.bfloat16() / temperature, -1).gather(...)`` in BF16, then ``.float()``.
    """
    logprobs = torch.log_softmax(logits.bfloat16() / temperature, dim=-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
