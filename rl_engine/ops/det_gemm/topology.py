"""The declared det_gemm topology shared by every backend (contract ``declared_exceptions.det_gemm``):
the check of a kernel's tree against the contract, and the mid-split leaf bounds."""

from __future__ import annotations

from rl_engine.contract import load_contract
from rl_engine.errors import ContractError, InputError


_AGREED: set[tuple[int, str, int]] = set()
"""(tree depth, implementation, id of the contract object) already checked: the op path asks on every
call, and the contract is loaded once per process, so the check costs one set lookup (and no file
system call that torch.compile would have to trace)."""


def check_contract_topology(tree_depth: int, implementation: str) -> None:
    """Raise ContractError when a kernel's tree differs from the contract's declaration.

    ``implementation`` names the kernel in the message (e.g. ``"the Triton det_gemm kernel"``).
    """
    contract = load_contract()
    key = (tree_depth, implementation, id(contract))
    if key in _AGREED:
        return
    declared = contract.det_gemm
    expected = {"tree_depth": tree_depth, "split_topology": "mid_split", "leaf_accumulation": "float32",
                "merge_dtype": "bfloat16", "output_dtype": "bfloat16"}
    for key, value in expected.items():
        if declared.get(key) != value:
            raise ContractError(
                f"declared_exceptions/det_gemm/{key}: the contract says {declared.get(key)!r}, "
                f"{implementation} implements {value!r}"
            )
    _AGREED.add(key)


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
