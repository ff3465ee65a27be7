"""Public entry points of ``rms_norm``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.rms_norm.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.rms_norm.op import *  # noqa: F401,F403 - the op's public names


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *,
             backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """RMSNorm over E. x: [T, E] bfloat16, weight: [E] bfloat16 -> [T, E] bfloat16.

    ``eps`` has no default: it comes from the model config (Qwen3: 1e-6; ``docs/pitfalls.md``,
    P12). ``order`` (contract ``declared_exceptions.rms_norm_rounding_order``): ``"hf"`` =
    ``bf16(weight * bf16(x * rsqrt(mean(x^2) + eps)))`` (Hugging Face Qwen3RMSNorm, the declared
    order); ``"fused"`` = ``bf16(x * rsqrt(mean(x^2) + eps) * weight)``, one rounding. Statistics
    in FP32. Backward: dx [T, E] and dweight [E] bfloat16 from the FP32 definition. On the kernel
    backends see :func:`rms_norm_kernel` (errors raised, reduction order).

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("rms_norm", backend)(x=x, weight=weight, eps=eps, order=order)
