"""The Qwen3 chain with its projections split row-parallel across the ranks of a process group.

Shape glossary: T tokens, E hidden, F ffn, H query heads, D head dim.

:class:`RowParallelQwen3Model` is :class:`rl_engine.chain.model.Qwen3Model` with one entry of its op
table changed: ``det_gemm``, which every linear layer (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``,
``down_proj``; ``x [T, K] @ W[N, K].T``) calls and nothing else does, runs as
:func:`rl_engine.tp.row_parallel_det_gemm`. Each
rank holds the full activations and the full weights (the simplest correct layout: no activation is
ever sharded across an op other than the GEMM), takes its contiguous K slice of ``x`` and of
``W.t()`` (the contract's mid-split, :func:`rl_engine.tp.shard_bounds`), runs det_gemm on it with a
tree ``log2(WS)`` levels shallower, and the partials are merged in BF16 in the contract's tree
order. Everything else (embedding, norms, RoPE, attention, SwiGLU, the logprob head) runs unsplit
on every rank, so every rank ends with the same activations.

For an Option B det_gemm the split product is bitwise equal to the unsplit one, so teacher forcing
through this model must give FP32 logprobs bitwise equal to the single-process model's, and hence
to the single-process rollout decode (strict profile, docs/decisions.md 15).

Forward only (teacher-forcing scoring under ``torch.no_grad``): the collectives carry no gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_engine.chain.model import Qwen3Model
from rl_engine.chain.weights import Qwen3Weights
from rl_engine.errors import RLEngineError
from rl_engine.tp.row_parallel import resolve_merge, row_parallel_full

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers split row-parallel (seven per decoder layer; the logprob head is not split)."""


class RowParallelQwen3Model(Qwen3Model):
    """Qwen3 dense model whose projections are row-parallel det_gemm calls across ``group``.

    Every rank of ``group`` must construct it with the same BF16 ``weights`` and call the same
    forwards in the same order (each projection is a collective). ``backend`` must be a kernel
    backend whose det_gemm takes a tree depth (``triton_cuda_bf16`` or ``cuda_bf16``); ``merge`` is a
    merge path of :mod:`rl_engine.tp.row_parallel` (``auto``: BF16 all-reduce on NCCL at WS = 2,
    gather + BF16 tree merge otherwise). ``linear_calls`` counts the row-parallel calls made.

    Raises
    ------
    RLEngineError
        No initialised process group.
    InputError
        An unknown merge path or an unsupported world size; see :func:`row_parallel_det_gemm`.
    BackendUnavailable
        The backend cannot run here.
    """

    def __init__(self, weights: Qwen3Weights, backend: str, group: Any = None, *, merge: str = "auto",
                 norm_order: str | None = None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RLEngineError("RowParallelQwen3Model needs an initialised torch.distributed process group")
        super().__init__(weights, backend, norm_order=norm_order)
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.merge = merge
        self.merge_path = resolve_merge(merge, self.world_size, str(dist.get_backend(group)))
        self.linear_calls = 0
        det_gemm = self.ops.impl("det_gemm")

        def row_parallel_det_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            """``a [T, K] @ b [K, N]`` (``b = W.t()``) -> [T, N] bfloat16, split over the ranks along K."""
            self.linear_calls += 1
            return row_parallel_full(a, b, self.group, merge=self.merge_path, backend=det_gemm)

        row_parallel_det_gemm.__wrapped__ = det_gemm  # the kernel id names the det_gemm kernel each rank runs
        self.ops = self.ops.replace(det_gemm=row_parallel_det_gemm)


def expected_linear_calls(model: Qwen3Model, forwards: int) -> int:
    """Row-parallel calls ``forwards`` forward passes make: 7 projections per decoder layer."""
    return forwards * len(PROJECTIONS) * model.config.num_hidden_layers
