"""FP32 reference for ``linear_logp`` (WS1 §3.1): ``log_softmax((hidden @ weight.T) / T)[target]``.

The same BF16 values upcast to FP32 (the gate upcasts them), an FP32 GEMM with TF32 off, an FP32
log-softmax (:func:`rl_engine.ops.logp.reference.fp32_log_softmax`) and a gather, all under
:func:`fp32_reference_guard`.
"""

import torch

from rl_engine.ops.logp.reference import fp32_log_softmax
from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def linear_logp_reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          temperature: float = 1.0) -> torch.Tensor:
    """hidden: [T, E] float32, weight: [V, E] float32, targets: [T] int64 -> [T] float32."""
    require_fp32(hidden=hidden, weight=weight)
    with fp32_reference_guard():
        logits = hidden @ weight.T
        logprobs = fp32_log_softmax(logits / temperature)
        return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
