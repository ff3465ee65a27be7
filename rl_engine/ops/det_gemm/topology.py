"""The declared det_gemm topology check shared by every backend (contract ``declared_exceptions.det_gemm``)."""

from __future__ import annotations

from rl_engine.contract import load_contract
from rl_engine.errors import ContractError


def check_contract_topology(tree_depth: int, implementation: str) -> None:
    """Raise ContractError when a kernel's tree differs from the contract's declaration.

    ``implementation`` names the kernel in the message (e.g. ``"the Triton det_gemm kernel"``).
    """
    declared = load_contract().det_gemm
    expected = {"tree_depth": tree_depth, "split_topology": "mid_split", "leaf_accumulation": "float32",
                "merge_dtype": "bfloat16", "output_dtype": "bfloat16"}
    for key, value in expected.items():
        if declared.get(key) != value:
            raise ContractError(
                f"declared_exceptions/det_gemm/{key}: the contract says {declared.get(key)!r}, "
                f"{implementation} implements {value!r}"
            )
