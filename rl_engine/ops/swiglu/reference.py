"""FP32 reference for SwiGLU (WS1 §3.1). Math: Shazeer 2020, "GLU Variants Improve Transformer";
the Qwen3 MLP ``down(act(gate(x)) * up(x))`` with ``act = silu``."""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gate * sigmoid(gate) * up`` in FP32. gate, up: [T, F] float32 -> [T, F] float32."""
    require_fp32(gate=gate, up=up)
    with fp32_reference_guard():
        return gate * torch.sigmoid(gate) * up
