"""Triton QK-norm: the RMSNorm kernels of :mod:`rl_engine.ops.rms_norm.triton` run on the T*H rows
of length D of [T, H, D] (row ``t * H + h``, addressed through the strides of x, no copy).

Every row is one program with the whole D in one block, so a (token, head) row's bits never depend
on T, H, neighbours or layout. dweight sums over all T*H rows in fixed chunks (no atomics).
"""

from __future__ import annotations

import torch

from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.rms_norm.triton import check_eps_order, rms_norm_rows


def qk_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """QK-norm with Triton kernels. x: [T, H, D] bfloat16, weight: [D] bfloat16 -> [T, H, D] bfloat16.

    FP32 statistics per (token, head) over D; ``order`` ``"hf"`` (declared) or ``"fused"`` as in
    :func:`rl_engine.ops.rms_norm.triton.rms_norm_triton`; ``eps`` has no default (pitfall P12).
    Backward: dx [T, H, D], dweight [D] bfloat16.

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on D; weight is not bfloat16 [D] with unit
        stride; devices differ; eps is not a finite number >= 0; order is not "hf" or "fused".
    BackendUnavailable
        The tensors are not on a CUDA device (and the Triton interpreter is off).
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=3, contiguous_last=True)
    check_tensor("weight", weight, dtype=torch.bfloat16, shape=(x.shape[2],), contiguous_last=True)
    check_same_device(x=x, weight=weight)
    check_eps_order(eps, order)
    return rms_norm_rows(x, weight, eps, order)
