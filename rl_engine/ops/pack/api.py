"""Public entry points of ``pack``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.pack.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import check_backend, resolve_impl
from rl_engine.ops.pack.op import *  # noqa: F401,F403 - the op's public names


def pack(x: torch.Tensor, cu_seqlens: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Padded -> packed. x: [B, S, E] bfloat16, cu_seqlens: [B+1] int32 -> [T, E] bfloat16.

    Row ``cu_seqlens[b] + s`` of the output is ``x[b, s]`` for ``s < L_b``; rows are exact copies.
    Every ``L_b <= S`` (validated). Backward: ``dx = unpack(dy, cu_seqlens, S)`` (zeros in the
    padding). The padding ``x[b, L_b:]`` is never read: NaN / inf there changes nothing
    (masked means absent, docs/declared-semantics.md). ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("pack", backend)(x=x, cu_seqlens=cu_seqlens)

def unpack(x: torch.Tensor, cu_seqlens: torch.Tensor, S: int, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Packed -> padded. x: [T, E] bfloat16, cu_seqlens: [B+1] int32, S: int -> [B, S, E] bfloat16.

    ``out[b, s] = x[cu_seqlens[b] + s]`` for ``s < L_b`` and exactly 0 in the padding; exact
    copies. The backward never reads the upstream gradient in the padding (NaN / inf there
    changes nothing; docs/declared-semantics.md). Backward: ``dx = pack(dy, cu_seqlens)``. ``backend`` is explicit (the same names as
    :func:`pack`).
    """
    from rl_engine.ops.pack.reference import unpack_reference
    from rl_engine.ops.pack.torch_bf16 import unpack_torch_bf16

    impls = {"reference_fp32": unpack_reference, "torch_bf16": unpack_torch_bf16, "triton_cuda_bf16": unpack_triton,
             "cuda_bf16": unpack_cuda}
    check_backend(backend)
    if backend not in impls:
        raise BackendUnavailable(f"op unpack has no {backend} implementation")
    return impls[backend](x=x, cu_seqlens=cu_seqlens, S=S)
