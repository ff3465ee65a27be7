"""Log-probabilities of target tokens, the op's one path: input checks shared by the logprob ops,
the torch ops ``rl_engine::logp_rows_fwd`` / ``rl_engine::logp_rows_bwd`` (fake shapes and
autograd registered) over the rows of ``logits3 [O, I, V]`` with an optional mask (shared with
``batch_invariant_logp``), the per-backend entry points the op spec lists, and the public
:func:`logp`. Kernels and launchers: ``triton.py``, ``cuda.py``.
"""

from __future__ import annotations

import math
from numbers import Real

import torch

from rl_engine.errors import InputError
from rl_engine.ops._torch_op import call, check_device, launchers, register_autograd, run
from rl_engine.ops._validate import check_index_range, check_same_device, check_tensor


# ------------------------------------------------------------------------------ validation
def check_temperature(temperature: object) -> float:
    """``temperature`` is a real number, finite and > 0; returns it as a Python float.

    Raises InputError otherwise (a bool, a tensor, 0, a negative value, NaN or inf).
    """
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise InputError(f"temperature: expected a Python number, got {type(temperature).__name__}")
    value = float(temperature)
    if not math.isfinite(value) or value <= 0.0:
        raise InputError(f"temperature: expected a finite number > 0, got {value}")
    return value


def check_logp_inputs(logits: torch.Tensor, targets: torch.Tensor, temperature: object, validate: bool = True) -> float:
    """logits [T, V] float32 (unit stride on V, V >= 1), targets int64 [T] on the same device,
    every target in [0, V) (only with ``validate``: it reads device values), temperature as
    :func:`check_temperature`. Returns the temperature as a float."""
    check_tensor("logits", logits, dtype=torch.float32, ndim=2, contiguous_last=True)
    t, v = logits.shape
    check_tensor("targets", targets, dtype=torch.int64, shape=(t,))
    check_same_device(logits=logits, targets=targets)
    if v < 1:
        raise InputError(f"logits: the vocabulary axis V is empty (shape {list(logits.shape)})")
    tau = check_temperature(temperature)
    if validate:
        check_index_range("targets", targets, v)
    return tau


# ------------------------------------------------------------------------------- torch ops
def _logp_rows_fwd(logits3: torch.Tensor, targets2: torch.Tensor, mask2: torch.Tensor | None, temperature: float,
                  block_v: int, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, row max, log sum-exp), each FP32 [O * I], of validated logits3 [O, I, V] fp32,
    targets2 [O, I] int64, optional mask2 [O, I] bool. ``block_v`` 0: the backend's fixed tile."""
    return launchers("logp", backend).forward_rows(logits3, targets2, mask2, temperature, block_v)


logp_rows_fwd = torch.library.custom_op("rl_engine::logp_rows_fwd", _logp_rows_fwd, mutates_args=())


@logp_rows_fwd.register_fake
def _(logits3, targets2, mask2, temperature, block_v, backend):
    rows = logits3.shape[0] * logits3.shape[1]
    return tuple(logits3.new_empty((rows,), dtype=torch.float32) for _ in range(3))


@torch.library.custom_op("rl_engine::logp_rows_bwd", mutates_args=())
def logp_rows_bwd(logits3: torch.Tensor, targets2: torch.Tensor, mask2: torch.Tensor | None, g: torch.Tensor,
                  rmax: torch.Tensor, rlog: torch.Tensor, temperature: float, block_v: int,
                  backend: str) -> torch.Tensor:
    """dlogits FP32 [O, I, V] (contiguous); zero rows where the mask is False."""
    return launchers("logp", backend).backward_rows(logits3, targets2, mask2, g, rmax, rlog, temperature, block_v)


@logp_rows_bwd.register_fake
def _(logits3, targets2, mask2, g, rmax, rlog, temperature, block_v, backend):
    return logits3.new_empty(tuple(logits3.shape), dtype=torch.float32)


def _setup(ctx, inputs, output):
    logits3, targets2, mask2, temperature, block_v, backend = inputs
    _out, rmax, rlog = output
    ctx.save_for_backward(logits3, targets2, rmax, rlog, *([mask2] if mask2 is not None else []))
    ctx.temperature, ctx.block_v, ctx.backend = temperature, block_v, backend


def _backward(ctx, g, _grad_rmax, _grad_rlog):
    logits3, targets2, rmax, rlog, *mask = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None, None, None, None, None, None
    dx = call(logp_rows_bwd, logits3, targets2, mask[0] if mask else None, g, rmax, rlog, ctx.temperature, ctx.block_v,
                       ctx.backend)
    return dx, None, None, None, None, None


register_autograd(logp_rows_fwd, _logp_rows_fwd, _backward, _setup)


def logp_rows(logits3: torch.Tensor, targets2: torch.Tensor, mask2: torch.Tensor | None, temperature: float,
              backend: str, block_v: int = 0) -> torch.Tensor:
    """FP32 logprobs [O * I] of validated rows on ``backend`` (differentiable in logits3)."""
    tensors = (logits3, targets2) if mask2 is None else (logits3, targets2, mask2)
    check_device(backend, *tensors)
    return run(logp_rows_fwd, _logp_rows_fwd, logits3, targets2, mask2, temperature, block_v, backend)[0]


# ---------------------------------------------------------------------------- entry points
def logp_kernel(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *, backend: str,
                validate: bool = True) -> torch.Tensor:
    """Log-probability of each target token on a kernel backend. logits: [T, V] float32,
    targets: [T] int64 -> [T] float32.

    ``out[t] = log_softmax(logits[t] / temperature)[targets[t]]``. Everything is FP32: the logits
    are never rounded to BF16, the max and sum-exp accumulate in FP32 over fixed V tiles (4096
    wide, in increasing order) and the output is FP32 (contract ``dtype_policy.logprob_output``,
    ``declared_exceptions.logits_for_scoring``; ``docs/pitfalls.md``, P4 and P11). Backward:
    dlogits [T, V] float32 = ``g * (onehot(target) - softmax(logits / temperature)) /
    temperature``. Entries of ``logits`` equal to ``-inf`` are allowed and contribute 0; NaN or
    ``+inf`` logits give NaN, as in ``torch.log_softmax``. ``validate=False`` skips the target
    range check (it reads device values) for a capture-safe call; the caller then guarantees it.

    Raises
    ------
    InputError
        logits is not 2-D float32 with unit stride on V, V is 0, targets is not int64 [T] on the
        same device, a target is outside [0, V) (with ``validate``), or temperature is not a
        finite number > 0.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    tau = check_logp_inputs(logits, targets, temperature, validate)
    return logp_rows(logits.unsqueeze(0), targets.unsqueeze(0), None, tau, backend)


def logp_triton(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """:func:`logp_kernel` on ``triton_cuda_bf16``."""
    return logp_kernel(logits, targets, temperature, backend="triton_cuda_bf16")


def logp_cuda(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """:func:`logp_kernel` on ``cuda_bf16``."""
    return logp_kernel(logits, targets, temperature, backend="cuda_bf16")


DECODE_ROWS = 8
"""The negative control's "decode-sized batch": at most this many rows take its BF16-logits path."""


def _size_dependent_block_v(t: int) -> int:
    # The V tile picked from the row count: 4096 for one row, halved per doubling of T, at least 256.
    from rl_engine.ops.logp.triton import BLOCK_V

    return max(256, BLOCK_V >> max(t - 1, 0).bit_length())


def logp_triton_size_dependent(logits: torch.Tensor, targets: torch.Tensor,
                               temperature: float = 1.0) -> torch.Tensor:
    """NEGATIVE CONTROL, never use: :func:`logp_triton` with two choices made from the row count T.

    * The V tile follows T (4096 for one row, halved per doubling of T, at least 256), so a row's
      FP32 sum-exp is grouped differently alone than inside a batch. The logprob often absorbs that
      (log() of a sum moved by one ulp rarely moves), so on its own this was seen to slip through
      the gate's check on the H200 at T = 1027.
    * Batches of at most :data:`DECODE_ROWS` rows take a "decode fast path" that rounds the logits
      to BF16 first (``docs/pitfalls.md``, P5's train/inference mismatch, made size dependent),
      which moves nearly every logprob.

    The ``batch`` invariance transform must catch it. Same signature and dtypes as
    :func:`logp_triton`.
    """
    tau = check_logp_inputs(logits, targets, temperature)
    check_device("triton_cuda_bf16", logits, targets)
    if logits.shape[0] <= DECODE_ROWS:
        logits = logits.to(torch.bfloat16).to(torch.float32)
    return logp_rows(logits.unsqueeze(0), targets.unsqueeze(0), None, tau, "triton_cuda_bf16",
                     block_v=_size_dependent_block_v(logits.shape[0]))
