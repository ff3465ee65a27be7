"""det_gemm: deterministic BF16 GEMM with the declared Option B K-reduction tree.

Public functions: :func:`det_gemm` (selects a backend explicitly), :func:`tp_split_det_gemm`
(the same product computed as a simulated tensor-parallel K split, merged in BF16) and
:func:`mid_split_bounds` (the contract's split topology).
"""

from rl_engine.ops.det_gemm.api import det_gemm, mid_split_bounds, tp_split_det_gemm

__all__ = ["det_gemm", "mid_split_bounds", "tp_split_det_gemm"]
