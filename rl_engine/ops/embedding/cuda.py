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

from rl_engine.backends.cuda_launch import launch


def embedding_fwd(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out [T, E] bf16 = weight[ids] for validated ids [T] int64 in [0, V), weight [V, E] bf16."""
    t = ids.shape[0]
    e = weight.shape[1]
    out = torch.empty((t, e), dtype=torch.bfloat16, device=weight.device)
    launch(weight.device, "rl_embedding_fwd", ids, weight, out, t, e, ids.stride(0), weight.stride(0), out.stride(0))
    return out


def embedding_bwd(ids: torch.Tensor, dy: torch.Tensor, v: int) -> torch.Tensor:
    """dweight [V, E] bf16: per referenced row the FP32 sum of its tokens' dy rows in token order."""
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
