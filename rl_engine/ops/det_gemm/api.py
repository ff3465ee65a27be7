"""Public entry points for det_gemm, and the split topology the contract declares.

Contract ``declared_exceptions.det_gemm`` (Option B, WS1 §9.2, DESIGN row 1): the K axis of
``a [M, K] @ b [K, N]`` is split at ``mid = lo + (hi - lo) // 2`` recursively ``tree_depth`` times
into ``2**tree_depth`` contiguous leaves; each leaf is accumulated in FP32 in increasing k and
rounded once to BF16; merges are ``bf16(fp32(left) + fp32(right))`` bottom-up,
``((l0 + l1) + (l2 + l3))`` for depth 2.

Because the splits are contiguous and nested, a rank of a row-parallel layer holding the K range
of one subtree computes exactly that subtree with a shallower tree, and a BF16 merge of the ranks'
results (what a 2-rank BF16 all-reduce does) reproduces the unsplit product bit for bit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.errors import InputError


def det_gemm(a: torch.Tensor, b: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Deterministic GEMM ``a @ b`` with the contract's K tree. a: [M, K] bfloat16, b: [K, N] bfloat16
    -> [M, N] bfloat16.

    Leaves accumulate in FP32, merges round to BF16 (contract ``declared_exceptions.det_gemm``).
    Gradients: da [M, K] and db [K, N], bfloat16, computed by the same tree on transposed views.
    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why; on the kernel
    backends, bad inputs raise InputError before any launch (``torch_bf16`` and
    ``reference_fp32`` are unvalidated comparison paths, docs/ops-api.md).
    """
    return resolve_impl("det_gemm", backend)(a=a, b=b)


def mid_split_bounds(lo: int, hi: int, depth: int) -> list[int]:
    """Leaf boundaries of ``[lo, hi)`` split by the mid-split rule ``depth`` times.

    Returns ``2**depth + 1`` non-decreasing integers from ``lo`` to ``hi``; leaf ``i`` is
    ``[bounds[i], bounds[i + 1])``. Example: ``mid_split_bounds(0, 97, 2) == [0, 24, 48, 72, 97]``.
    """
    if depth < 0:
        raise InputError(f"tree depth must be >= 0, got {depth}")
    if hi < lo:
        raise InputError(f"empty range [{lo}, {hi})")
    if depth == 0:
        return [lo, hi]
    mid = lo + (hi - lo) // 2
    return mid_split_bounds(lo, mid, depth - 1) + mid_split_bounds(mid, hi, depth - 1)[1:]


def merge_bf16(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The contract's merge ``bf16(fp32(left) + fp32(right))`` (what a 2-rank BF16 all-reduce does)."""
    return (left.float() + right.float()).to(torch.bfloat16)


def _accepts_tree_depth(impl: Callable[..., torch.Tensor]) -> bool:
    try:
        return "tree_depth" in inspect.signature(impl).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


def tp_split_det_gemm(a: torch.Tensor, b: torch.Tensor, parts: int,
                      impl: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``a @ b`` as a simulated tensor-parallel row-parallel layer with K split into ``parts`` ranks.

    a: [M, K] bfloat16, b: [K, N] bfloat16 -> [M, N] bfloat16. K is split by the mid-split rule
    into ``parts`` (a supported split of the contract: 1, 2 or 4) contiguous pieces; rank ``r``
    computes ``impl(a[:, K_r], b[K_r, :], tree_depth=tree_depth - log2(parts))`` (an ``impl``
    without a ``tree_depth`` argument is called as ``impl(a_r, b_r)``), and the partial results
    are merged in BF16 in tree order, ``((p0 + p1) + (p2 + p3))``. For an implementation of the
    declared topology this equals ``impl(a, b)`` bit for bit (the spec's ``tp`` transform).
    Differentiable when ``impl`` is.

    Raises
    ------
    InputError
        ``parts`` is not a supported split, or the operands are not 2-D with matching K.
    """
    from rl_engine.contract import load_contract

    declared = load_contract().det_gemm
    if parts not in declared["supported_splits"]:
        raise InputError(f"parts must be one of the contract's supported splits {declared['supported_splits']}, got {parts}")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2):
        raise InputError("a and b must be 2-D tensors [M, K] and [K, N]")
    if a.shape[1] != b.shape[0]:
        raise InputError(f"a is [M, K] = {list(a.shape)} but b is [K, N] = {list(b.shape)}: K differs")
    level = parts.bit_length() - 1
    depth = int(declared["tree_depth"]) - level
    bounds = mid_split_bounds(0, a.shape[1], level)
    with_depth = _accepts_tree_depth(impl)
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        a_r, b_r = a[:, lo:hi], b[lo:hi, :]
        pieces.append(impl(a=a_r, b=b_r, tree_depth=depth) if with_depth else impl(a=a_r, b=b_r))
    while len(pieces) > 1:
        pieces = [merge_bf16(pieces[i], pieces[i + 1]) for i in range(0, len(pieces), 2)]
    return pieces[0]
