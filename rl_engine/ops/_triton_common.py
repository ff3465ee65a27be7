"""Pieces shared by the Triton kernels of every op.

The one rule for matrix products: every ``tl.dot`` in the package goes through :func:`mma`, which
passes ``input_precision="ieee"`` explicitly, so no FP32 dot can silently run in TF32 (WS1 §9.7,
pitfall P6). Under the Triton CPU interpreter BF16 dots are not supported
(triton-lang/triton#11584), so the operands are upcast to FP32 first; BF16 x BF16 products are
exact in FP32, only the accumulation order can differ from the GPU's tensor cores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine import env
from rl_engine.errors import BackendUnavailable


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr):
    """Return ``acc + a @ b`` with an FP32 accumulator and IEEE input precision."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision="ieee")


def upcast_dots() -> bool:
    """True under the interpreter: BF16 ``tl.dot`` operands are upcast to FP32 (see module doc)."""
    return env.triton_interpret()


_INTERPRETER_PATCHED = False


def _patch_interpreter_rounding() -> None:
    """Make the Triton CPU interpreter round FP32 -> BF16 to nearest even, as the GPU does.

    The interpreter's ``_convert_float`` truncates FP32 -> BF16 by default (and its RTNE branch
    rounds ties away and can overflow the mantissa), so kernels run in CI would not produce the
    bits the GPU produces (``cvt.rn.bf16.f32``). This replaces that one conversion with PyTorch's
    round-to-nearest-even cast. Applied on the first launch under ``TRITON_INTERPRET=1`` only;
    compiled GPU kernels are untouched.
    """
    global _INTERPRETER_PATCHED
    if _INTERPRETER_PATCHED:
        return
    import numpy as np
    from triton.runtime import interpreter as _interp

    original = getattr(_interp, "_convert_float", None)
    if original is None:  # pragma: no cover - a Triton without this helper
        raise BackendUnavailable("this Triton's interpreter has no _convert_float; cannot fix BF16 rounding")
    rtz = getattr(_interp._ir.ROUNDING_MODE, "RTZ", None)

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and (rtz is None or rounding_mode != rtz):
            arr = np.ascontiguousarray(input).view(np.float32).copy()
            out = torch.from_numpy(arr).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return out.reshape(np.shape(input))
        return original(input, input_dtype, output_dtype, rounding_mode)

    _interp._convert_float = convert
    _INTERPRETER_PATCHED = True


def check_triton_device(*tensors: torch.Tensor) -> None:
    """Triton kernels need CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``."""
    interpret = env.triton_interpret()
    if interpret:
        _patch_interpreter_rounding()
    for t in tensors:
        if t.device.type == "cuda":
            continue
        if t.device.type == "cpu" and interpret:
            continue
        if t.device.type == "cpu":
            raise BackendUnavailable(
                "triton_cuda_bf16 needs CUDA tensors; CPU tensors run only under TRITON_INTERPRET=1"
            )
        raise BackendUnavailable(f"triton_cuda_bf16 cannot run on device {t.device}")
