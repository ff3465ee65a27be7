"""Public entry points of ``logp``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.logp.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.logp.op import *  # noqa: F401,F403 - the op's public names


def logp(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    backend: str = "triton_cuda_bf16",
) -> torch.Tensor:
    """Log-probability of each target token: ``log_softmax(logits / temperature)[targets]``.

    logits: [T, V] float32 (never rounded to BF16), targets: [T] int64 in [0, V),
    temperature: finite float > 0 -> [T] float32. FP32 max, sum-exp and output
    (``docs/pitfalls.md``, P4 and P11). Gradient: logits. ``backend`` is explicit; an unavailable
    backend raises BackendUnavailable naming why. On the kernel backends, bad inputs raise
    InputError before any launch (``torch_bf16`` and ``reference_fp32`` are unvalidated comparison
    paths, docs/ops-api.md); see :func:`logp_kernel`.
    """
    return resolve_impl("logp", backend)(logits=logits, targets=targets, temperature=temperature)
