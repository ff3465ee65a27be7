"""Public entry points of ``det_gemm``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.det_gemm.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.det_gemm.op import *  # noqa: F401,F403 - the op's public names
from rl_engine.ops.det_gemm.op import _accepts_tree_depth  # noqa: F401


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
