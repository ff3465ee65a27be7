"""``linear_logp``, the op's one path: input checks, the torch ops ``rl_engine::linear_logp_fwd`` /
``rl_engine::linear_logp_bwd`` (fake shapes and autograd registered), the per-backend entry points
the op spec lists, and the public :func:`linear_logp`. Kernels and launchers: ``triton.py``,
``cuda.py``.
"""

from __future__ import annotations

import torch

from rl_engine.errors import InputError
from rl_engine.ops._torch_op import call, check_device, launchers, placeholder, register_autograd, run
from rl_engine.ops._validate import check_index_range, check_same_device, check_tensor
from rl_engine.ops.logp.op import check_temperature


def _linear_logp_fwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, row max, log sum-exp), each FP32 [T], of validated inputs."""
    return launchers("linear_logp", backend).linear_logp_fwd(hidden, weight, targets, temperature)


linear_logp_fwd = torch.library.custom_op("rl_engine::linear_logp_fwd", _linear_logp_fwd, mutates_args=())


@linear_logp_fwd.register_fake
def _(hidden, weight, targets, temperature, backend):
    return tuple(hidden.new_empty((hidden.shape[0],), dtype=torch.float32) for _ in range(3))


@torch.library.custom_op("rl_engine::linear_logp_bwd", mutates_args=())
def linear_logp_bwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, g: torch.Tensor,
                    rmax: torch.Tensor, rlog: torch.Tensor, temperature: float, need_dh: bool, need_dw: bool,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dhidden [T, E], dweight [V, E]) bf16; a gradient not asked for is a 0-element tensor."""
    dh, dw = launchers("linear_logp", backend).linear_logp_bwd(hidden, weight, targets, g, rmax, rlog, temperature,
                                                               need_dh, need_dw)
    return placeholder(dh, need_dh, hidden), placeholder(dw, need_dw, hidden)


@linear_logp_bwd.register_fake
def _(hidden, weight, targets, g, rmax, rlog, temperature, need_dh, need_dw, backend):
    return (hidden.new_empty(hidden.shape if need_dh else (0,), dtype=torch.bfloat16),
            hidden.new_empty(weight.shape if need_dw else (0,), dtype=torch.bfloat16))


def _setup(ctx, inputs, output):
    hidden, weight, targets, temperature, backend = inputs
    _out, rmax, rlog = output
    ctx.save_for_backward(hidden, weight, targets, rmax, rlog)
    ctx.temperature, ctx.backend = temperature, backend


def _backward(ctx, g, _grad_rmax, _grad_rlog):
    hidden, weight, targets, rmax, rlog = ctx.saved_tensors
    need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (need_dh or need_dw):
        return None, None, None, None, None
    dh, dw = call(linear_logp_bwd, hidden, weight, targets, g, rmax, rlog, ctx.temperature, need_dh, need_dw,
                  ctx.backend)
    return (dh if need_dh else None), (dw if need_dw else None), None, None, None


register_autograd(linear_logp_fwd, _linear_logp_fwd, _backward, _setup)


def linear_logp_kernel(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                       *, backend: str, validate: bool = True) -> torch.Tensor:
    """Fused LM head + log-softmax + gather on a kernel backend. hidden: [T, E] bfloat16, weight:
    [V, E] bfloat16, targets: [T] int64 -> [T] float32; no [T, V] buffer in forward or backward.

    ``out[t] = log_softmax((hidden[t] @ weight.T) / temperature)[targets[t]]``. The logits are the
    FP32 accumulator of BF16 x BF16 products (IEEE input precision), never rounded to BF16; max,
    sum-exp and the output are FP32 over fixed V chunks of 4096 (contract
    ``declared_exceptions.logits_for_scoring``; ``docs/pitfalls.md``, P4, P5 and P11). Backward:
    dhidden [T, E] bfloat16 and dweight [V, E] bfloat16 from FP32 dlogits chunks
    ``g * (onehot - softmax) / temperature``, accumulated in FP32 in a fixed order and rounded
    once (Triton: each dlogits tile stored as a BF16 pair ``hi + lo`` for tensor-core products;
    CUDA: FP32 math on CUDA cores, bitwise equal to ``logp_cuda(lm_head_cuda(hidden, weight),
    targets, temperature)``). Deterministic, no atomics. ``validate=False`` skips the target
    range check (it reads device values) for a capture-safe call.

    Raises
    ------
    InputError
        hidden / weight not 2-D bfloat16 with unit stride on E, mismatched E, E or V = 0, targets
        not int64 [T] on the same device, a target outside [0, V) (with ``validate``), or a
        temperature that is not a finite number > 0.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    check_tensor("hidden", hidden, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    t, e = hidden.shape
    check_tensor("weight", weight, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if weight.shape[1] != e:
        raise InputError(f"weight: expected shape [V, {e}] (E of hidden), got {list(weight.shape)}")
    check_tensor("targets", targets, dtype=torch.int64, shape=(t,))
    check_same_device(hidden=hidden, weight=weight, targets=targets)
    v = weight.shape[0]
    if v < 1 or e < 1:
        raise InputError(f"weight: V and E must be >= 1, got shape {list(weight.shape)}")
    tau = check_temperature(temperature)
    if validate:
        check_index_range("targets", targets, v)
    check_device(backend, hidden, weight, targets)
    return run(linear_logp_fwd, _linear_logp_fwd, hidden, weight, targets, tau, backend)[0]


def linear_logp_triton(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """:func:`linear_logp_kernel` on ``triton_cuda_bf16``."""
    return linear_logp_kernel(hidden, weight, targets, temperature, backend="triton_cuda_bf16")


def linear_logp_cuda(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     temperature: float = 1.0) -> torch.Tensor:
    """:func:`linear_logp_kernel` on ``cuda_bf16``."""
    return linear_logp_kernel(hidden, weight, targets, temperature, backend="cuda_bf16")
