"""Public entry points of ``linear_logp``: the backend is chosen by name through the backend registry
(``rl_engine/backends/registry.py``). The torch ops, the per-backend entry points and the input
checks live in :mod:`rl_engine.ops.linear_logp.op` (re-exported here); this module is the only one of the
op that reads the registry, so the registry can resolve the op's implementations without an
import cycle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.ops.linear_logp.op import *  # noqa: F401,F403 - the op's public names


def linear_logp(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    backend: str = "triton_cuda_bf16",
) -> torch.Tensor:
    """Fused LM head + target logprob: ``log_softmax((hidden @ weight.T) / temperature)[targets]``.

    hidden: [T, E] bfloat16, weight: [V, E] bfloat16, targets: [T] int64 in [0, V),
    temperature: finite float > 0 -> [T] float32. FP32 logits (never rounded to BF16), FP32
    max / sum-exp / output, no [T, V] buffer (``docs/pitfalls.md``, P5). Gradients: hidden, weight
    (BF16). ``backend`` is explicit; on the kernel backends, bad inputs raise InputError before any
    launch (``torch_bf16`` and ``reference_fp32`` are unvalidated comparison paths,
    docs/ops-api.md); see :func:`linear_logp_kernel`.
    """
    return resolve_impl("linear_logp", backend)(
        hidden=hidden, weight=weight, targets=targets, temperature=temperature
    )
