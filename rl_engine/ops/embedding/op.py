"""Token embedding, the op's one path: input checks, the torch ops ``rl_engine::embedding_fwd`` /
``rl_engine::embedding_bwd`` (fake shapes and autograd registered), the per-backend entry points
the op spec lists, and the public :func:`embedding`. Kernels and launchers: ``triton.py``,
``cuda.py``.
"""

from __future__ import annotations

import torch

from rl_engine.ops._torch_op import call, check_device, grad_bf16, launchers, register_autograd, run
from rl_engine.ops._validate import check_index_range, check_same_device, check_tensor


def _embedding_fwd(ids: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
    """out [T, E] bf16 = weight[ids] (ids validated)."""
    return launchers("embedding", backend).embedding_fwd(ids, weight)


embedding_fwd = torch.library.custom_op("rl_engine::embedding_fwd", _embedding_fwd, mutates_args=())


@embedding_fwd.register_fake
def _(ids, weight, backend):
    return weight.new_empty((ids.shape[0], weight.shape[1]), dtype=torch.bfloat16)


@torch.library.custom_op("rl_engine::embedding_bwd", mutates_args=())
def embedding_bwd(ids: torch.Tensor, dy: torch.Tensor, vocab: int, backend: str) -> torch.Tensor:
    """dweight [V, E] bf16 from dy [T, E] bf16."""
    return launchers("embedding", backend).embedding_bwd(ids, dy, vocab)


@embedding_bwd.register_fake
def _(ids, dy, vocab, backend):
    return dy.new_empty((vocab, dy.shape[1]), dtype=torch.bfloat16)


def _setup(ctx, inputs, output):
    ids, weight, backend = inputs
    ctx.save_for_backward(ids)
    ctx.vocab, ctx.backend = weight.shape[0], backend


def _backward(ctx, dy):
    (ids,) = ctx.saved_tensors
    if not ctx.needs_input_grad[1]:
        return None, None, None
    return None, call(embedding_bwd, ids, grad_bf16(dy), ctx.vocab, ctx.backend), None


register_autograd(embedding_fwd, _embedding_fwd, _backward, _setup)


def embedding_kernel(ids: torch.Tensor, weight: torch.Tensor, *, backend: str, validate: bool = True) -> torch.Tensor:
    """Token embedding on a kernel backend. ids: [T] int64, weight: [V, E] bfloat16 -> [T, E] bfloat16.

    Forward rows are exact copies of weight rows (no arithmetic). Backward: dweight [V, E]
    bfloat16, each referenced row the FP32 sum of its tokens' upstream rows in token order
    (stable sort + segment sums, no atomics), rounded once; unreferenced rows are 0.

    ``validate=False`` skips the one check that reads device values (ids in ``[0, V)``, a host
    synchronisation) so the call can be captured in a CUDA graph; the caller then guarantees the
    range (e.g. checked once per plan outside the graph). Shapes, dtypes and devices are always
    checked.

    Raises
    ------
    InputError
        ids is not a 1-D int64 tensor with unit stride; weight is not a 2-D bfloat16 tensor with
        unit stride on E; they sit on different devices; or (with ``validate``) an id lies outside ``[0, V)``
        (``docs/pitfalls.md``, P9: nothing is wrapped or clamped). Checked before any launch.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    check_tensor("ids", ids, dtype=torch.int64, ndim=1, contiguous_last=True)
    check_tensor("weight", weight, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_same_device(ids=ids, weight=weight)
    if validate:
        check_index_range("ids", ids, weight.shape[0])
    check_device(backend, ids, weight)
    return run(embedding_fwd, _embedding_fwd, ids, weight, backend)


def embedding_triton(ids: torch.Tensor, weight: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """:func:`embedding_kernel` on ``triton_cuda_bf16``."""
    return embedding_kernel(ids, weight, backend="triton_cuda_bf16", validate=validate)


def embedding_cuda(ids: torch.Tensor, weight: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """:func:`embedding_kernel` on ``cuda_bf16``."""
    return embedding_kernel(ids, weight, backend="cuda_bf16", validate=validate)
