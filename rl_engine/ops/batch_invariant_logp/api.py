"""Public entry points of ``batch_invariant_logp``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.batch_invariant_logp.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.batch_invariant_logp.op import *  # noqa: F401,F403 - the op's public names


def batch_invariant_logp(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    backend: str = "triton_cuda_bf16",
) -> torch.Tensor:
    """Target logprobs in the padded layout: ``log_softmax(logits / temperature)[targets]``.

    logits: [B, S, V] float32, targets: [B, S] int64, mask: [B, S] bool -> [B, S] float32,
    0 where mask is False (targets there are not validated or used). Masked rows are absent
    (docs/declared-semantics.md): NaN / inf in their logits or their upstream gradient changes no
    output and no gradient; their dlogits are exactly 0. FP32 logits, max, sum-exp and
    output; each row bitwise equal to ``logp`` on that row, independent of B, S and padding.
    Gradient: logits. ``backend`` is explicit; on the kernel backends,
    bad inputs raise InputError before any launch (``torch_bf16`` and ``reference_fp32`` are
    unvalidated comparison paths, docs/ops-api.md).
    """
    return resolve_impl("batch_invariant_logp", backend)(
        logits=logits, targets=targets, mask=mask, temperature=temperature
    )
