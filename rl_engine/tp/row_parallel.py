"""Real tensor-parallel (row-parallel) det_gemm across the ranks of a ``torch.distributed`` group.

Shape glossary: M rows (tokens), K reduction width (input features), N output features, WS world
size (ranks of the group), ``K_r`` the width of rank r's K slice.

A row-parallel linear layer splits the reduction axis K over the ranks: rank r holds the contiguous
slice ``[k_r, k_{r+1})`` of the activations ``x [M, K]`` and of the weight ``b = W.t() [K, N]``,
computes a partial product over its slice, and the partial products are summed across ranks.

The contract's ``declared_exceptions.det_gemm`` (Option B, docs/decisions.md 1) makes that sum bitwise
equal to the unsplit product: the slices are the top ``log2(WS)`` levels of the mid-split tree
(:func:`rl_engine.ops.det_gemm.mid_split_bounds`), rank r runs det_gemm on its slice with a tree
``log2(WS)`` levels shallower (``tree_depth - log2(WS)``), which reproduces that subtree of the
unsplit tree bit for bit, and the partials are merged like the unsplit tree merges its subtrees:
``bf16(fp32(left) + fp32(right))`` bottom-up, ``((p0 + p1) + (p2 + p3))`` for WS = 4.

Merge paths (the one used is returned by :func:`resolve_merge` and recorded by the runner):

``all_reduce_bf16``
    ``dist.all_reduce(SUM)`` of the BF16 partials. Only for WS = 2, where the reduction is a single
    add: a 2-rank NCCL BF16 all-reduce was seen to equal ``bf16(fp32(a) + fp32(b))`` bit for bit on
    the two-GPU H200 machine (DESIGN, "Machines"). For WS = 4 a collective's reduction order is not
    the contract's tree, so this path is refused. The default on NCCL at WS = 2.
``gather_tree_bf16``
    ``dist.all_gather`` of the BF16 partials, then the contract's merge in tree order on every rank
    (FP32 add of two BF16 values, rounded to BF16, level by level). Exact by construction on any
    backend and any supported WS; the default everywhere except NCCL at WS = 2.
``gather_fp32_control``
    KNOWN-BREAKING negative control (not for use): every rank computes its BF16 leaves (the
    contract's leaves, ``tree_depth = 0`` per leaf) but sums them in FP32 without rounding, the
    FP32 partials are gathered and summed in FP32 in tree order, and the sum is rounded to BF16
    once. It drops the contract's BF16 merge roundings, so it must differ from the unsplit
    product; the runner checks that the equality check catches it.

Validation runs on every rank before any data moves: each rank checks its own inputs, then one
small ``all_gather`` of ``[ok, M, K_r, N]`` lets every rank check the others' (same M and N, K
slices equal to the mid-split of the total K) and raise the same :class:`InputError`, so a bad
input on one rank never leaves the other ranks waiting in a collective.

Forward only: the collectives are not differentiable here, so a call with autograd recording on
an input that requires a gradient raises InputError (the TP chain scores under ``torch.no_grad``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rl_engine.errors import InputError, RLEngineError

MERGE_ALL_REDUCE = "all_reduce_bf16"
MERGE_GATHER = "gather_tree_bf16"
MERGE_FP32_CONTROL = "gather_fp32_control"
MERGES = (MERGE_ALL_REDUCE, MERGE_GATHER, MERGE_FP32_CONTROL)
"""Every merge path; ``auto`` picks :data:`MERGE_ALL_REDUCE` on NCCL at WS = 2, else :data:`MERGE_GATHER`."""

MERGE_DESCRIPTIONS = {
    MERGE_ALL_REDUCE: "dist.all_reduce(SUM) of the BF16 partials (WS = 2 only: one add, "
                      "equal to bf16(fp32(p0) + fp32(p1)) on NCCL)",
    MERGE_GATHER: "dist.all_gather of the BF16 partials, then bf16(fp32(left) + fp32(right)) in tree order "
                  "((p0 + p1) + (p2 + p3)) on every rank",
    MERGE_FP32_CONTROL: "KNOWN-BREAKING control: BF16 leaves summed in FP32 on each rank, FP32 partials "
                        "gathered and summed in FP32 in tree order, rounded to BF16 once",
}


# -- topology ----------------------------------------------------------------------------------
def supported_world_sizes() -> list[int]:
    """The contract's ``declared_exceptions.det_gemm.supported_splits`` (1, 2, 4)."""
    from rl_engine.contract import load_contract

    return [int(s) for s in load_contract().det_gemm["supported_splits"]]


def contract_tree_depth() -> int:
    """The contract's ``declared_exceptions.det_gemm.tree_depth`` (2)."""
    from rl_engine.contract import load_contract

    return int(load_contract().det_gemm["tree_depth"])


def check_world_size(world_size: int) -> int:
    """Return ``log2(world_size)``; raise InputError unless it is one of the contract's supported splits."""
    supported = supported_world_sizes()
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size not in supported:
        raise InputError(f"world size must be one of the contract's supported splits {supported} "
                         f"(declared_exceptions.det_gemm.supported_splits), got {world_size!r}")
    return world_size.bit_length() - 1


def rank_tree_depth(world_size: int) -> int:
    """Tree depth each rank runs: ``tree_depth - log2(world_size)`` (2, 1, 0 for WS = 1, 2, 4)."""
    return contract_tree_depth() - check_world_size(world_size)


def shard_bounds(k: int, world_size: int) -> list[int]:
    """K boundaries of the ranks' slices: ``WS + 1`` integers from 0 to ``k``; rank r owns
    ``[bounds[r], bounds[r + 1])``. The top ``log2(WS)`` levels of the contract's mid-split tree."""
    from rl_engine.ops.det_gemm import mid_split_bounds

    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InputError(f"K must be a non-negative int, got {k!r}")
    return mid_split_bounds(0, k, check_world_size(world_size))


def shard_k(x: torch.Tensor, b: torch.Tensor, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s slices ``x[:, k_r:k_{r+1}]`` [M, K_r] and ``b[k_r:k_{r+1}, :]`` [K_r, N] (views, no copy).

    ``x`` [M, K] and ``b`` [K, N] (e.g. ``W.t()`` of a weight ``W [N, K]``) of any float dtype.
    Raises InputError on a rank outside ``[0, world_size)`` or on mismatched K.
    """
    if not (isinstance(x, torch.Tensor) and isinstance(b, torch.Tensor) and x.dim() == 2 and b.dim() == 2):
        raise InputError("x and b must be 2-D tensors [M, K] and [K, N]")
    if x.shape[1] != b.shape[0]:
        raise InputError(f"x is [M, K] = {list(x.shape)} but b is [K, N] = {list(b.shape)}: K differs")
    bounds = shard_bounds(int(x.shape[1]), world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise InputError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    lo, hi = bounds[rank], bounds[rank + 1]
    return x[:, lo:hi], b[lo:hi, :]


def resolve_merge(merge: str, world_size: int, dist_backend: str) -> str:
    """The merge path a call uses: ``merge`` itself, or for ``auto`` ``all_reduce_bf16`` on NCCL at
    WS = 2 and ``gather_tree_bf16`` otherwise. Raises InputError on an unknown path, or on
    ``all_reduce_bf16`` at a WS other than 2 (a collective's order is not the contract's tree)."""
    if merge == "auto":
        return MERGE_ALL_REDUCE if (dist_backend == "nccl" and world_size == 2) else MERGE_GATHER
    if merge not in MERGES:
        raise InputError(f"merge must be 'auto' or one of {MERGES}, got {merge!r}")
    if merge == MERGE_ALL_REDUCE and world_size != 2:
        raise InputError(f"merge {MERGE_ALL_REDUCE} needs world size 2 (a single add); at world size "
                         f"{world_size} the collective's reduction order is not the contract's tree: use {MERGE_GATHER}")
    return merge


def _impl_for(backend_or_impl: str | Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    from rl_engine.ops.det_gemm.api import _accepts_tree_depth

    if isinstance(backend_or_impl, str):
        from rl_engine.backends.registry import resolve_impl

        impl = resolve_impl("det_gemm", backend_or_impl)
        name = backend_or_impl
    else:
        impl, name = backend_or_impl, getattr(backend_or_impl, "__name__", repr(backend_or_impl))
    if not callable(impl) or not _accepts_tree_depth(impl):
        raise InputError(f"det_gemm implementation {name} takes no tree_depth argument: a rank must run a "
                         f"shallower tree, so only the Option B kernels (triton_cuda_bf16, cuda_bf16) can be split")
    return impl


# -- tree merges (local, after the exchange) ----------------------------------------------------
def tree_merge_bf16(parts: list[torch.Tensor]) -> torch.Tensor:
    """Merge BF16 partials [M, N] (in K order) like the contract's tree: ``bf16(fp32(l) + fp32(r))``
    bottom-up, ``((p0 + p1) + (p2 + p3))``. FP32 is used only for each single add."""
    from rl_engine.ops.det_gemm.api import merge_bf16

    while len(parts) > 1:
        parts = [merge_bf16(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def tree_sum_fp32(parts: list[torch.Tensor]) -> torch.Tensor:
    """FP32 sum of FP32 [M, N] tensors in the same tree order, without rounding (the control)."""
    while len(parts) > 1:
        parts = [parts[i].float() + parts[i + 1].float() for i in range(0, len(parts), 2)]
    return parts[0].float()


# -- the distributed call -----------------------------------------------------------------------
def _dist():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RLEngineError("row_parallel_det_gemm needs an initialised torch.distributed process group "
                            "(torch.distributed.init_process_group)")
    return dist


def _comm_device(dist_backend: str, fallback: Any) -> torch.device:
    if dist_backend == "nccl":
        if isinstance(fallback, torch.Tensor) and fallback.is_cuda:
            return fallback.device
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _local_problem(x: Any, w: Any) -> str | None:
    """This rank's own input check (no collective): None when fine, else the message."""
    from rl_engine.ops._validate import check_same_device, check_tensor

    try:
        check_tensor("x_shard", x, dtype=torch.bfloat16, ndim=2)
        check_tensor("w_shard", w, dtype=torch.bfloat16, ndim=2)
        check_same_device(x_shard=x, w_shard=w)
        if x.shape[1] != w.shape[0]:
            raise InputError(f"x_shard is [M, K_r] = {list(x.shape)} but w_shard is [K_r, N] = "
                             f"{list(w.shape)}: K_r differs")
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            raise InputError("row_parallel_det_gemm is forward only (its collectives are not differentiable): "
                             "call it under torch.no_grad() or on tensors that do not require a gradient")
    except InputError as exc:
        return str(exc)
    return None


def _check_group(dist: Any, group: Any, x: Any, w: Any) -> tuple[int, int, str]:
    """Validate every rank's inputs together; returns (rank, world size, dist backend)."""
    ws = dist.get_world_size(group)
    rank = dist.get_rank(group)
    backend = str(dist.get_backend(group))
    problem = _local_problem(x, w)
    try:
        check_world_size(ws)
    except InputError as exc:  # the same on every rank: raise before any collective
        raise InputError(f"row_parallel_det_gemm: {exc}") from None
    dev = _comm_device(backend, x)
    if problem is None:
        meta = torch.tensor([1, x.shape[0], x.shape[1], w.shape[1]], dtype=torch.int64, device=dev)
    else:
        meta = torch.tensor([0, -1, -1, -1], dtype=torch.int64, device=dev)
    metas = [torch.empty_like(meta) for _ in range(ws)]
    dist.all_gather(metas, meta, group=group)
    table = [[int(v) for v in m.cpu().tolist()] for m in metas]
    if problem is not None:
        raise InputError(f"row_parallel_det_gemm (rank {rank} of {ws}): {problem}")
    bad = [r for r, row in enumerate(table) if row[0] != 1]
    if bad:
        raise InputError(f"row_parallel_det_gemm (rank {rank} of {ws}): the inputs of rank(s) {bad} are invalid "
                         f"(see the error raised there)")
    ms, ks, ns = [row[1] for row in table], [row[2] for row in table], [row[3] for row in table]
    if len(set(ms)) != 1 or len(set(ns)) != 1:
        raise InputError(f"row_parallel_det_gemm (rank {rank} of {ws}): every rank must hold x_shard [M, K_r] and "
                         f"w_shard [K_r, N] of one M and one N; got M per rank {ms}, N per rank {ns}")
    k_total = sum(ks)
    bounds = shard_bounds(k_total, ws)
    want = [hi - lo for lo, hi in zip(bounds[:-1], bounds[1:])]
    if ks != want:
        raise InputError(f"row_parallel_det_gemm (rank {rank} of {ws}): the K slices per rank {ks} are not the "
                         f"contract's mid-split of K = {k_total} into {ws} contiguous parts {want} (rank r must "
                         f"hold [bounds[r], bounds[r+1]) of rl_engine.tp.shard_bounds(K, {ws}))")
    return rank, ws, backend


def _fp32_control_partial(x: torch.Tensor, w: torch.Tensor, depth: int,
                          impl: Callable[..., torch.Tensor]) -> torch.Tensor:
    """The control's rank partial: the rank's BF16 leaves, summed in FP32 in tree order (no rounding)."""
    from rl_engine.ops.det_gemm import mid_split_bounds

    bounds = mid_split_bounds(0, int(x.shape[1]), depth)
    leaves = [impl(a=x[:, lo:hi], b=w[lo:hi, :], tree_depth=0) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return tree_sum_fp32([leaf.float() for leaf in leaves])


def row_parallel_det_gemm(x_shard: torch.Tensor, w_shard: torch.Tensor, group: Any = None, *,
                          merge: str = "auto",
                          backend: str | Callable[..., torch.Tensor] = "triton_cuda_bf16") -> torch.Tensor:
    """One row-parallel det_gemm across the ranks of ``group`` (collective: every rank calls it).

    x_shard: [M, K_r] bfloat16, this rank's contiguous K slice of the activations ``x [M, K]``;
    w_shard: [K_r, N] bfloat16, the same K slice of ``b = W.t()`` (any strides, e.g. a slice of a
    transposed ``[N, K]`` weight). Rank r must hold ``[bounds[r], bounds[r+1])`` of
    :func:`shard_bounds` ``(K, WS)``. Returns ``x @ b`` [M, N] bfloat16, identical on every rank and,
    for an Option B kernel, bitwise equal to the unsplit ``det_gemm(x, b)``.

    Each rank runs ``backend``'s det_gemm (``triton_cuda_bf16`` by default, or a callable taking
    ``a, b, tree_depth``) on its slice with ``tree_depth - log2(WS)``: FP32 accumulation inside each
    leaf, BF16 leaves and merges. The partials are merged in BF16 by ``merge`` (see the module
    docstring: ``auto``, ``all_reduce_bf16``, ``gather_tree_bf16``; ``gather_fp32_control`` is a
    known-breaking control). FP32 appears only in single adds of two BF16 values (and in the
    control's sums). Math source: contract ``declared_exceptions.det_gemm`` (WS1 §9.2, docs/decisions.md 1).

    Raises
    ------
    InputError
        On every rank, when any rank's operands are not 2-D bfloat16 on one device with matching
        K_r, when M or N differ between ranks, when the K slices are not the contract's mid-split,
        when the world size is not a supported split (1, 2, 4), on an unknown merge, on
        ``all_reduce_bf16`` at a world size other than 2, on a backend whose det_gemm has no tree
        depth, or when autograd would need a gradient through the collective.
    RLEngineError
        No process group is initialised.
    BackendUnavailable
        ``backend`` cannot run here.
    """
    dist = _dist()
    rank, ws, dist_backend = _check_group(dist, group, x_shard, w_shard)
    path = resolve_merge(merge, ws, dist_backend)
    impl = _impl_for(backend)
    depth = rank_tree_depth(ws)
    if path == MERGE_FP32_CONTROL:
        partial = _fp32_control_partial(x_shard, w_shard, depth, impl)
        parts = [torch.empty_like(partial) for _ in range(ws)]
        dist.all_gather(parts, partial.contiguous(), group=group)
        return tree_sum_fp32(parts).to(torch.bfloat16)
    partial = impl(a=x_shard, b=w_shard, tree_depth=depth).contiguous()
    if ws == 1:
        return partial
    if path == MERGE_ALL_REDUCE:
        dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=group)
        return partial
    parts = [torch.empty_like(partial) for _ in range(ws)]
    dist.all_gather(parts, partial, group=group)
    return tree_merge_bf16(parts)


def row_parallel_full(x: torch.Tensor, b: torch.Tensor, group: Any = None, *, merge: str = "auto",
                      backend: str | Callable[..., torch.Tensor] = "triton_cuda_bf16") -> torch.Tensor:
    """Convenience for ranks that hold the full ``x [M, K]`` and ``b [K, N]`` (bfloat16): take this
    rank's K slice (:func:`shard_k`) and call :func:`row_parallel_det_gemm`. Returns [M, N] bfloat16.
    Raises as :func:`row_parallel_det_gemm` (and InputError on mismatched K before any collective)."""
    dist = _dist()
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    try:
        x_r, b_r = shard_k(x, b, rank, ws)
    except InputError:
        x_r, b_r = x, b  # let the collective validation raise the same error on every rank
    return row_parallel_det_gemm(x_r, b_r, group, merge=merge, backend=backend)
