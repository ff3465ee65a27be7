"""Triton token embedding, forward and backward.

Forward: one program per (token, block of ``BLOCK`` columns) copies ``weight[ids[t]]`` to row
``t`` of the output; values are moved as BF16 bits, never converted, so rows are exact copies
and every row depends only on its own id (batch invariance by construction).

Backward (gradient of ``weight``): deterministic, no atomics. The ids are sorted with a stable
sort, so the tokens of one id form a contiguous segment in original token order. One program per
(segment, column block) adds that segment's upstream rows in FP32, in that order, and writes the
BF16 sum to the id's row once. Rows of ``weight`` that no token references get exactly 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv

BLOCK = 1024
"""Columns per program (a fixed constant; the column grid covers E)."""


@triton.jit
def _embedding_fwd_kernel(ids_ptr, w_ptr, out_ptr, n_cols, stride_ids, stride_w, stride_out,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    idx = tl.load(ids_ptr + row * stride_ids).to(tl.int64)
    vals = tl.load(w_ptr + idx * stride_w + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_out + cols, vals, mask=mask)


@triton.jit
def _embedding_bwd_kernel(seg_ids_ptr, seg_start_ptr, seg_end_ptr, order_ptr, dy_ptr, dw_ptr, n_cols,
                          stride_dy, stride_dw, BLOCK: tl.constexpr):
    seg = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    idx = tl.load(seg_ids_ptr + seg).to(tl.int64)
    start = tl.load(seg_start_ptr + seg)
    end = tl.load(seg_end_ptr + seg)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(start, end):
        src = tl.load(order_ptr + j).to(tl.int64)
        acc += tl.load(dy_ptr + src * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(dw_ptr + idx * stride_dw + cols, acc.to(tl.bfloat16), mask=mask)


def embedding_fwd(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out [T, E] bf16 = weight[ids] for validated ids [T] int64 in [0, V), weight [V, E] bf16."""
    t = ids.shape[0]
    e = weight.shape[1]
    out = torch.empty((t, e), dtype=torch.bfloat16, device=weight.device)
    if t and e:
        _embedding_fwd_kernel[(t, cdiv(e, BLOCK))](
            ids, weight, out, e, ids.stride(0), weight.stride(0), out.stride(0), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return out


def _segments(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stable sort of the ids and the [start, end) of each distinct id in the sorted order."""
    sorted_ids, order = torch.sort(ids, stable=True)
    seg_ids, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    return seg_ids.contiguous(), starts.to(torch.int64), ends.to(torch.int64), order.contiguous()


def embedding_bwd(ids: torch.Tensor, dy: torch.Tensor, v: int) -> torch.Tensor:
    """dweight [V, E] bf16: per referenced row the FP32 sum of its tokens' dy rows in token order."""
    t, e = dy.shape
    dw = torch.zeros((v, e), dtype=torch.bfloat16, device=dy.device)
    if t and e:
        seg_ids, starts, ends, order = _segments(ids)
        _embedding_bwd_kernel[(seg_ids.shape[0], cdiv(e, BLOCK))](
            seg_ids, starts, ends, order, dy, dw, e, dy.stride(0), dw.stride(0), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return dw
