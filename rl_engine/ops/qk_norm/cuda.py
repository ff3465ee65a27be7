"""CUDA C++ QK-norm (``cuda_bf16`` backend): the RMSNorm kernels of
:mod:`rl_engine.ops.rms_norm.cuda` on the T*H rows of length D of [T, H, D] (row ``t * H + h``,
addressed through the strides of x, no copy).

Every (token, head) row is one block with a reduction order fixed by D alone, so its bits never
depend on T, H, neighbours or layout. dweight sums over all T*H rows in fixed chunks of 64 rows
(no atomics).
"""

from __future__ import annotations

import torch

from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.rms_norm.cuda import rms_norm_rows_cuda
from rl_engine.ops.rms_norm.triton import check_eps_order


def qk_norm_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """QK-norm with CUDA C++ kernels. x: [T, H, D] bfloat16, weight: [D] bfloat16 -> [T, H, D] bfloat16.

    RMSNorm over D per (token, head) (Hugging Face Qwen3 ``q_norm`` / ``k_norm``), FP32
    statistics; ``order`` ``"hf"`` (declared) or ``"fused"`` as in
    :func:`rl_engine.ops.rms_norm.cuda.rms_norm_cuda`; ``eps`` has no default (pitfall P12).
    Backward: dx [T, H, D], dweight [D] bfloat16.

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on D; weight is not bfloat16 [D] with unit
        stride; devices differ; eps is not a finite number >= 0; order is not "hf" or "fused".
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=3, contiguous_last=True)
    check_tensor("weight", weight, dtype=torch.bfloat16, shape=(x.shape[2],), contiguous_last=True)
    check_same_device(x=x, weight=weight)
    check_eps_order(eps, order)
    return rms_norm_rows_cuda(x, weight, eps, order)
