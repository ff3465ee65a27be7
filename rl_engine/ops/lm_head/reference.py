"""FP32 reference for lm_head (WS1 §3.1): ``hidden @ weight^T`` as an FP32 GEMM of the upcast inputs.

Math: the Qwen3 LM head (Hugging Face ``Qwen3ForCausalLM.lm_head``, a bias-free ``nn.Linear``).
"""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def lm_head_reference(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden: [T, E] float32, weight: [V, E] float32 -> logits [T, V] float32 (TF32 off)."""
    require_fp32(hidden=hidden, weight=weight)
    with fp32_reference_guard():
        return hidden @ weight.t()
