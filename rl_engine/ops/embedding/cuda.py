"""CUDA C++ token embedding (``cuda_bf16`` backend), forward and backward.

Kernels in ``rl_engine/backends/cuda_src/elementwise.cu``. Forward (``rl_embedding_fwd``): one
block per (token, 1024 columns) copies the BF16 bits of ``weight[ids[t]]`` (no arithmetic), so
every row is an exact copy and depends only on its own id.

Backward (``rl_embedding_bwd``), deterministic without atomics: the ids are sorted stably on the
device (``torch.sort(stable=True)``), so the tokens of one id form a contiguous segment in token
order; one block per (segment, column block) adds the segment's upstream rows in FP32 in that
order and writes the BF16 sum to the id's row once. Unreferenced rows are exactly 0.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch, unit_last
from rl_engine.ops._validate import check_index_range, check_same_device, check_tensor


def _fwd(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    t = ids.shape[0]
    e = weight.shape[1]
    out = torch.empty((t, e), dtype=torch.bfloat16, device=weight.device)
    launch(weight.device, "rl_embedding_fwd", ids, weight, out, t, e, ids.stride(0), weight.stride(0), out.stride(0))
    return out


def _bwd(ids: torch.Tensor, dy: torch.Tensor, v: int) -> torch.Tensor:
    t, e = dy.shape
    dw = torch.zeros((v, e), dtype=torch.bfloat16, device=dy.device)
    if t == 0 or e == 0:
        return dw
    sorted_ids, order = torch.sort(ids, stable=True)
    seg_ids, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    seg_ids = seg_ids.to(torch.int64).contiguous()
    starts = starts.to(torch.int64).contiguous()
    ends = ends.to(torch.int64).contiguous()
    order = order.to(torch.int64).contiguous()
    launch(dy.device, "rl_embedding_bwd", seg_ids, starts, ends, order, dy, dw, seg_ids.shape[0], e, dy.stride(0),
           dw.stride(0))
    return dw


class _EmbeddingCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight):
        ctx.save_for_backward(ids)
        ctx.vocab = weight.shape[0]
        return _fwd(ids, weight)

    @staticmethod
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None
        return None, _bwd(ids, unit_last(dy.to(torch.bfloat16)), ctx.vocab)


def embedding_cuda(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Token embedding with CUDA C++ kernels. ids: [T] int64, weight: [V, E] bfloat16 -> [T, E] bfloat16.

    Forward rows are exact copies of weight rows. Backward: dweight [V, E] bfloat16, each
    referenced row the FP32 sum of its tokens' upstream rows in token order (stable sort +
    segment sums, no atomics), rounded once; unreferenced rows are 0.

    Raises
    ------
    InputError
        ids is not a 1-D int64 tensor; weight is not a 2-D bfloat16 tensor with unit stride on E;
        they sit on different devices; or an id lies outside ``[0, V)`` (pitfall P9: nothing is
        wrapped or clamped). Checked before any launch.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("ids", ids, dtype=torch.int64, ndim=1)
    check_tensor("weight", weight, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_same_device(ids=ids, weight=weight)
    check_index_range("ids", ids, weight.shape[0])
    check_cuda_device(ids, weight)
    return _EmbeddingCuda.apply(ids, weight)
