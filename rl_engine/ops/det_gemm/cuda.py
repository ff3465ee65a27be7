"""CUDA C++ det_gemm (``cuda_bf16`` backend), forward and backward, with the contract's Option B tree.

Kernel ``rl_det_gemm`` in ``rl_engine/backends/cuda_src/gemm.cu``: one block of 8 warps owns one
128 x 128 output tile; BF16 operands reach shared memory in 128 x 32 tiles (any strides; 16-byte
vector loads where the layout allows, which never changes the values) and are multiplied with
WMMA 16x16x16 BF16 tensor-core tiles into FP32 accumulators.

Topology (contract ``declared_exceptions.det_gemm``, checked at every call): the K axis is split by
``mid = lo + (hi - lo) // 2`` recursively ``TREE_DEPTH = 2`` times (bounds from
:func:`rl_engine.ops.det_gemm.api.mid_split_bounds`, passed to the kernel) into four contiguous
leaves; each leaf is accumulated in FP32 over 32-wide K steps starting at the leaf's own first
index, in increasing k, and rounded to BF16; merges are ``bf16(fp32(l) + fp32(r))`` as
``((l0 + l1) + (l2 + l3))``. A tensor-parallel rank holding the K range of one subtree passes
``tree_depth = TREE_DEPTH - log2(parts)`` and runs exactly the same K steps, so a BF16 merge of the
ranks equals the unsplit product bit for bit.

Leaf-parallel form (``rl_det_gemm_leaves``): for outputs of fewer than ``LEAF_SPLIT_BELOW_TILES``
tiles (decode), one block per (tile, leaf) runs the same leaf loop into a BF16 workspace and a
second kernel applies the same merges; same bits, ``2^depth`` times the blocks.

Batch invariance: output ``(m, n)`` is computed from row m of ``a`` and column n of ``b`` by the
same MMA sequence whatever M, the row's position in its tile, or the operand strides.

Backward (deterministic, no atomics): ``da = dc @ b^T`` and ``db = a^T @ dc`` by the same kernel on
transposed views, with the full ``TREE_DEPTH`` tree over their own reduction axis.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch
from rl_engine.errors import InputError
from rl_engine.ops.det_gemm.topology import check_contract_topology as _check_topology
from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.det_gemm.api import mid_split_bounds

TREE_DEPTH = 2
"""Depth of the K tree; must equal the contract's ``declared_exceptions.det_gemm.tree_depth``."""


TILE = 128
"""Output tile of the kernel (rows and columns)."""

LEAF_SPLIT_BELOW_TILES = 264
"""The leaf-parallel form (``rl_det_gemm_leaves``) runs when the output has fewer 128 x 128 tiles
than this (twice the H200's 132 SMs), e.g. every decode-step projection. It runs the same leaf
loops and merges as the fused kernel, so the bits are the same (tested); the choice depends only
on M and N."""


def use_leaf_split(m: int, n: int, depth: int) -> bool:
    """Whether :func:`_launch` takes the leaf-parallel form for an ``[m, n]`` output."""
    return depth > 0 and -(-m // TILE) * -(-n // TILE) < LEAF_SPLIT_BELOW_TILES


def _launch(a: torch.Tensor, b: torch.Tensor, depth: int, leaf_split: bool | None = None) -> torch.Tensor:
    """C [M, N] bf16 = tree-reduced a [M, K] @ b [K, N]; any strides (no copies).

    ``leaf_split`` forces the form (None: :func:`use_leaf_split`); tests compare the two."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return c
    bounds = mid_split_bounds(0, k, depth)
    bounds = bounds + [k] * (5 - len(bounds))
    if leaf_split is None:
        leaf_split = use_leaf_split(m, n, depth)
    if leaf_split:
        if depth == 0:
            raise ValueError("the leaf-parallel form needs depth >= 1")
        w = torch.empty((1 << depth, m, n), dtype=torch.bfloat16, device=a.device)
        launch(a.device, "rl_det_gemm_leaves", a, b, c, w, m, n, k, a.stride(0), a.stride(1), b.stride(0),
               b.stride(1), c.stride(0), c.stride(1), depth, *bounds)
        return c
    launch(a.device, "rl_det_gemm", a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
           c.stride(0), c.stride(1), depth, *bounds)
    return c


class _DetGemmCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, depth):
        ctx.save_for_backward(a, b)
        return _launch(a, b, depth)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        dc = dc.to(torch.bfloat16)
        da = _launch(dc, b.t(), TREE_DEPTH) if ctx.needs_input_grad[0] else None
        db = _launch(a.t(), dc, TREE_DEPTH) if ctx.needs_input_grad[1] else None
        return da, db, None


def check_contract_topology() -> None:
    """Raise ContractError when this module's tree differs from the contract's declaration."""
    _check_topology(TREE_DEPTH, "the CUDA det_gemm kernel")


def det_gemm_cuda(a: torch.Tensor, b: torch.Tensor, *, tree_depth: int = TREE_DEPTH) -> torch.Tensor:
    """Deterministic GEMM with the contract's K tree, CUDA C++. a: [M, K] bfloat16, b: [K, N]
    bfloat16 -> [M, N] bfloat16.

    Any strides on either operand (e.g. ``b = W.t()`` for a weight ``W [N, K]``); no copies. FP32
    accumulation inside each leaf (tensor cores), BF16 rounding of each leaf and each merge
    (contract ``declared_exceptions.det_gemm``, Option B). ``tree_depth`` is ``TREE_DEPTH`` (2) for
    a full product; a tensor-parallel rank holding K/2 (K/4) of the reduction passes 1 (0).
    Backward: da [M, K], db [K, N] bfloat16 by the same tree on transposed views.

    Raises
    ------
    ContractError
        ``TREE_DEPTH`` or the tree's dtypes differ from the contract (checked at every call).
    InputError
        a or b is not a 2-D bfloat16 tensor, their K sizes differ, they sit on different devices,
        or ``tree_depth`` is not an int in ``[0, TREE_DEPTH]``.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_contract_topology()
    check_tensor("a", a, dtype=torch.bfloat16, ndim=2)
    check_tensor("b", b, dtype=torch.bfloat16, ndim=2)
    if a.shape[1] != b.shape[0]:
        raise InputError(f"a is [M, K] = {list(a.shape)} but b is [K, N] = {list(b.shape)}: K differs")
    check_same_device(a=a, b=b)
    if isinstance(tree_depth, bool) or not isinstance(tree_depth, int) or not 0 <= tree_depth <= TREE_DEPTH:
        raise InputError(f"tree_depth must be an int in [0, {TREE_DEPTH}], got {tree_depth!r}")
    check_cuda_device(a, b)
    return _DetGemmCuda.apply(a, b, tree_depth)
