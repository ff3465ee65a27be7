"""RMSNorm (Qwen3RMSNorm) with an explicit rounding order and an explicit eps.

Public functions: :func:`rms_norm` (selects a backend explicitly) and
:func:`add_rms_norm_kernel` (the residual add fused into the norm, differentiable, on a kernel
backend).
"""

from rl_engine.ops.rms_norm.api import add_rms_norm_kernel, rms_norm

__all__ = ["add_rms_norm_kernel", "rms_norm"]
