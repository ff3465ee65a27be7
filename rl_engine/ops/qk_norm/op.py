"""QK-norm, the op's one path: the RMSNorm torch ops (``rl_engine::rms_norm_fwd`` / ``_bwd``,
:mod:`rl_engine.ops.rms_norm.api`) run on the T*H rows of length D of a [T, H, D] tensor (row
``t * H + h``, addressed through the strides of x, no copy). Every (token, head) row is one
program (Triton) or one block (CUDA) whose reduction order is fixed by D alone, so a row's bits
never depend on T, H, neighbours or layout. dweight sums over all T*H rows in fixed chunks of 64
rows (no atomics).
"""

from __future__ import annotations

import torch

from rl_engine.ops.rms_norm.op import check_rows, rms_norm_rows


def qk_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *,
                   backend: str) -> torch.Tensor:
    """QK-norm on a kernel backend. x: [T, H, D] bfloat16, weight: [D] bfloat16 -> [T, H, D] bfloat16.

    RMSNorm over D per (token, head) (Hugging Face Qwen3 ``q_norm`` / ``k_norm``), FP32
    statistics; ``order`` ``"hf"`` (declared) or ``"fused"`` as in
    :func:`rl_engine.ops.rms_norm.api.rms_norm_kernel`; ``eps`` has no default
    (``docs/pitfalls.md``, P12). Backward: dx [T, H, D], dweight [D] bfloat16.

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on D; weight is not bfloat16 [D] with unit
        stride; devices differ; eps is not a finite number >= 0; order is not "hf" or "fused".
    BackendUnavailable
        The backend cannot run on the tensors' device (as :func:`rms_norm_kernel`).
    """
    check_rows(x, weight, eps, order, 3)
    return rms_norm_rows(x, weight, eps, order, backend)


def qk_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """:func:`qk_norm_kernel` on ``triton_cuda_bf16``."""
    return qk_norm_kernel(x, weight, eps, order, backend="triton_cuda_bf16")


def qk_norm_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """:func:`qk_norm_kernel` on ``cuda_bf16``."""
    return qk_norm_kernel(x, weight, eps, order, backend="cuda_bf16")
