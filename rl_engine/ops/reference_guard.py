"""The FP32 reference guard (WS1 §3.1 condition 3): TF32 and autocast off, asserted, recorded.

Every FP32 reference runs inside :func:`fp32_reference_guard`. The guard turns TF32 off for
cuBLAS and cuDNN, sets the FP32 matmul precision to ``"highest"``, disables autocast on CPU and
CUDA, asserts the readback, and restores the previous state in ``finally`` even when the body
raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def precision_readback() -> dict[str, Any]:
    """The current TF32 / matmul-precision / autocast settings, as recorded in evidence."""
    return {
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "autocast_cpu": bool(torch.is_autocast_enabled("cpu")),
        "autocast_cuda": bool(torch.is_autocast_enabled("cuda")),
    }


@contextlib.contextmanager
def fp32_reference_guard() -> Iterator[dict[str, Any]]:
    """Run the body with TF32 and autocast disabled; yields the asserted readback.

    Raises
    ------
    AssertionError
        If the settings did not take effect (the reference would not be a WS1 reference).
    """
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            readback = precision_readback()
            if readback["cuda_matmul_allow_tf32"] or readback["cudnn_allow_tf32"]:
                raise AssertionError(f"TF32 still enabled inside the reference guard: {readback}")
            if readback["float32_matmul_precision"] != "highest":
                raise AssertionError(f"float32 matmul precision is not 'highest': {readback}")
            if readback["autocast_cpu"] or readback["autocast_cuda"]:
                raise AssertionError(f"autocast still enabled inside the reference guard: {readback}")
            yield readback
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.backends.cudnn.allow_tf32 = saved[1]
        torch.set_float32_matmul_precision(saved[2])


def require_fp32(**tensors: torch.Tensor) -> None:
    """References accept only FP32 floating inputs (the gate upcasts the BF16 inputs first)."""
    for name, t in tensors.items():
        if t.is_floating_point() and t.dtype != torch.float32:
            raise TypeError(f"reference input {name} must be float32 (upcast BF16), got {t.dtype}")
