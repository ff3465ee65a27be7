"""QK-norm, the op's one path: the RMSNorm torch ops (``rl_engine::rms_norm_fwd`` / ``_bwd``,
:mod:`rl_engine.ops.rms_norm.api`) run on the T*H rows of length D of a [T, H, D] tensor (row
``t * H + h``, addressed through the strides of x, no copy). Every (token, head) row is one
program (Triton) or one block (CUDA) whose reduction order is fixed by D alone, so a row's bits
never depend on T, H, neighbours or layout. dweight sums over all T*H rows in fixed chunks of 64
rows (no atomics).
"""

from __future__ import annotations

import torch

from rl_engine.errors import InputError
from rl_engine.ops.rms_norm.op import check_rows, norm_rope_rows, rms_norm_rows


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


def qk_norm_rope_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str, cos: torch.Tensor,
                        sin: torch.Tensor, *, backend: str, validate: bool = True) -> torch.Tensor:
    """QK-norm then RoPE, differentiable: ``rope(qk_norm(x, weight, eps, order), cos, sin)``,
    bitwise the two separate ops forward and backward (the training form of the decode launch
    :func:`rl_engine.chain.fused.qk_norm_rope`; tested).

    x: [T, H, D] bfloat16 (unit stride on D; D / 2 a power of two), weight: [D] bfloat16, cos / sin:
    [T, D/2] float32 (unit stride on the last axis) -> [T, H, D] bfloat16. FP32 inside: the norm's
    declared arithmetic (``docs/declared-arithmetic.md``), its output rounded to BF16, rotated in
    FP32 without fused multiply-adds and rounded once (as :func:`rl_engine.ops.rope.op.rope_kernel`).
    Backward: the rotation by ``-sin`` rounded to BF16, then the norm's backward: dx [T, H, D],
    dweight [D] bfloat16 (cos / sin take no gradient). Both backends run one kernel forward and
    the norm's backward kernels with the rotation inside their loads (``cuda_bf16`` for D <= 256;
    longer heads run its separate kernels, the same bits).

    Raises
    ------
    InputError
        As :func:`qk_norm_kernel` and :func:`rl_engine.ops.rope.op.rope_kernel`; D = 0 or D / 2
        not a power of two. Checked before any launch (``validate=False``: the caller ran
        :func:`check_qk_norm_rope` itself).
    BackendUnavailable
        As :func:`qk_norm_kernel`.
    """
    if validate:
        check_qk_norm_rope(x, weight, eps, order, cos, sin)
    return norm_rope_rows(x, weight, cos, sin, eps, order, backend)


def check_qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: object, order: object, cos: torch.Tensor,
                       sin: torch.Tensor) -> None:
    """The input checks of :func:`qk_norm_rope_kernel` (raises InputError; launches nothing), so a
    caller with several calls can check them all before the first launch."""
    from rl_engine.ops.rope.op import validate_rope_inputs

    check_rows(x, weight, eps, order, 3)
    validate_rope_inputs(x, cos, sin)
    half = x.shape[2] // 2
    if half == 0 or half & (half - 1):
        raise InputError(f"x: the fused QK-norm + RoPE needs D / 2 a power of two, got D = {x.shape[2]}")


def qk_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """:func:`qk_norm_kernel` on ``triton_cuda_bf16``."""
    return qk_norm_kernel(x, weight, eps, order, backend="triton_cuda_bf16")


def qk_norm_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """:func:`qk_norm_kernel` on ``cuda_bf16``."""
    return qk_norm_kernel(x, weight, eps, order, backend="cuda_bf16")
