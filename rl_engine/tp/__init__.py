"""Real tensor parallelism (row-parallel det_gemm across ``torch.distributed`` ranks).

* :func:`row_parallel_det_gemm` — one row-parallel GEMM: each rank's contiguous K slice through
  det_gemm with a tree ``log2(WS)`` levels shallower, partials merged in BF16 in the contract's
  tree order (``declared_exceptions.det_gemm``); bitwise equal to the unsplit product.
* :func:`shard_bounds`, :func:`shard_k`, :func:`rank_tree_depth`, :func:`resolve_merge` — the split
  topology and merge paths.
* :mod:`rl_engine.tp.chain` — :class:`~rl_engine.tp.chain.RowParallelQwen3Model`, the Qwen3 chain
  with its projections split row-parallel.
* :mod:`rl_engine.tp.launch` — spawning ranks (gloo on CPU, nccl on GPUs) with NVLS / multicast off.
* ``python -m rl_engine.tp.run`` — the checks, written to ``tp.json``.

Only :mod:`rl_engine.tp.row_parallel` is imported eagerly (it imports no kernel module).
"""

from rl_engine.tp.row_parallel import (MERGE_ALL_REDUCE, MERGE_FP32_CONTROL, MERGE_GATHER, MERGES, check_world_size,
                                       rank_tree_depth, resolve_merge, row_parallel_det_gemm, row_parallel_full,
                                       shard_bounds, shard_k, supported_world_sizes)

__all__ = ["MERGES", "MERGE_ALL_REDUCE", "MERGE_FP32_CONTROL", "MERGE_GATHER", "check_world_size", "rank_tree_depth",
           "resolve_merge", "row_parallel_det_gemm", "row_parallel_full", "shard_bounds", "shard_k",
           "supported_world_sizes"]
