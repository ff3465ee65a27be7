"""det_gemm, the op's one path: input checks, the torch op ``rl_engine::det_gemm`` (fake shape
and autograd registered; the backward runs the same op on transposed views), the per-backend
entry points the op spec lists, the public :func:`det_gemm`, and the tensor-parallel split.
Kernels and launchers: ``triton.py``, ``cuda.py``; the leaf bounds: ``topology.py``.

Contract ``declared_exceptions.det_gemm`` (Option B, WS1 §9.2; ``docs/decisions.md``): the K axis of
``a [M, K] @ b [K, N]`` is split at ``mid = lo + (hi - lo) // 2`` recursively ``tree_depth`` times
into ``2**tree_depth`` contiguous leaves; each leaf is accumulated in FP32 in increasing k and
rounded once to BF16; merges are ``bf16(fp32(left) + fp32(right))`` bottom-up,
``((l0 + l1) + (l2 + l3))`` for depth 2.

Because the splits are contiguous and nested, a rank of a row-parallel layer holding the K range
of one subtree computes exactly that subtree with a shallower tree, and a BF16 merge of the ranks'
results (what a 2-rank BF16 all-reduce does) reproduces the unsplit product bit for bit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from rl_engine.errors import InputError
from rl_engine.ops._torch_op import call, check_device, launchers, register_autograd, run
from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.det_gemm.topology import check_contract_topology, mid_split_bounds


TREE_DEPTH = 2
"""The declared depth of the K tree (the default ``tree_depth``); each backend module's own
``TREE_DEPTH`` is checked against the contract at every call."""

_KERNEL_NAME = {"triton_cuda_bf16": "the Triton det_gemm kernel", "cuda_bf16": "the CUDA det_gemm kernel"}


def _det_gemm_op(a: torch.Tensor, b: torch.Tensor, depth: int, fp32_merge: bool, backend: str) -> torch.Tensor:
    """C [M, N] bf16 = tree-reduced a [M, K] @ b [K, N] (validated; any strides)."""
    return launchers("det_gemm", backend).det_gemm_launch(a, b, depth, fp32_merge)


det_gemm_op = torch.library.custom_op("rl_engine::det_gemm", _det_gemm_op, mutates_args=())


@det_gemm_op.register_fake
def _(a, b, depth, fp32_merge, backend):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16)


def _setup(ctx, inputs, output):
    a, b, _depth, fp32_merge, backend = inputs
    ctx.save_for_backward(a, b)
    ctx.fp32_merge, ctx.backend = fp32_merge, backend


def weight_layout(b: torch.Tensor) -> bool:
    """Whether ``b [K, N]`` is the transpose of a row-major weight ``W [N, K]`` (``b = W.t()``, the
    model's layout): its gradient is then computed as ``dW = dc^T a`` directly in W's layout."""
    return b.dim() == 2 and b.stride(0) == 1 and b.stride(1) != 1 and b.shape[1] > 1


def _backward(ctx, dc):
    a, b = ctx.saved_tensors
    dc = dc.to(torch.bfloat16)
    depth = launchers("det_gemm", ctx.backend).TREE_DEPTH
    da = call(det_gemm_op, dc, b.t(), depth, ctx.fp32_merge, ctx.backend) if ctx.needs_input_grad[0] else None
    db = None
    if ctx.needs_input_grad[1]:
        # db[k, n] = tree over m of a[m, k] dc[m, n]. For b = W.t() the same reduction is computed as
        # dW [N, K] = dc^T a (each element the same exact products over the same m blocks, leaves and
        # merges; tested bit for bit), so the gradient lands in W's row-major layout and autograd
        # does not copy a transposed [K, N] gradient into W.grad (7 x 36 copies per Qwen3-8B step).
        if weight_layout(b):
            db = call(det_gemm_op, dc.t(), a, depth, ctx.fp32_merge, ctx.backend).t()
        else:
            db = call(det_gemm_op, a.t(), dc, depth, ctx.fp32_merge, ctx.backend)
    return da, db, None, None, None


register_autograd(det_gemm_op, _det_gemm_op, _backward, _setup)


def _det_gemm(a: torch.Tensor, b: torch.Tensor, tree_depth: object, fp32_merge: bool, backend: str) -> torch.Tensor:
    max_depth = launchers("det_gemm", backend).TREE_DEPTH
    check_contract_topology(max_depth, _KERNEL_NAME[backend])
    check_tensor("a", a, dtype=torch.bfloat16, ndim=2)
    check_tensor("b", b, dtype=torch.bfloat16, ndim=2)
    if a.shape[1] != b.shape[0]:
        raise InputError(f"a is [M, K] = {list(a.shape)} but b is [K, N] = {list(b.shape)}: K differs")
    check_same_device(a=a, b=b)
    if isinstance(tree_depth, bool) or not isinstance(tree_depth, int) or not 0 <= tree_depth <= max_depth:
        raise InputError(f"tree_depth must be an int in [0, {max_depth}], got {tree_depth!r}")
    check_device(backend, a, b)
    return run(det_gemm_op, _det_gemm_op, a, b, tree_depth, fp32_merge, backend)


def det_gemm_kernel(a: torch.Tensor, b: torch.Tensor, *, backend: str, tree_depth: int = TREE_DEPTH) -> torch.Tensor:
    """Deterministic GEMM with the contract's K tree on a kernel backend. a: [M, K] bfloat16,
    b: [K, N] bfloat16 -> [M, N] bfloat16.

    Any strides on either operand (e.g. ``b = W.t()`` for a weight ``W [N, K]``); no copies are
    made. FP32 accumulation inside each leaf, BF16 rounding of each leaf and each merge (contract
    ``declared_exceptions.det_gemm``, Option B). ``tree_depth`` is ``TREE_DEPTH`` (2) for a full
    product; a tensor-parallel rank holding K/2 (K/4) of the reduction passes 1 (0).
    Backward: da [M, K], db [K, N] bfloat16 by the same tree on transposed views; for ``b = W.t()``
    the weight gradient is computed as ``dW = dc^T a`` in W's row-major layout (same bits).

    Raises
    ------
    ContractError
        The backend's ``TREE_DEPTH`` or the tree's dtypes differ from the contract (checked at
        every call).
    InputError
        a or b is not a 2-D bfloat16 tensor, their K sizes differ, they sit on different devices,
        or ``tree_depth`` is not an int in ``[0, TREE_DEPTH]``.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    return _det_gemm(a, b, tree_depth, False, backend)


def det_gemm_triton(a: torch.Tensor, b: torch.Tensor, *, tree_depth: int = TREE_DEPTH) -> torch.Tensor:
    """:func:`det_gemm_kernel` on ``triton_cuda_bf16``."""
    return _det_gemm(a, b, tree_depth, False, "triton_cuda_bf16")


def det_gemm_cuda(a: torch.Tensor, b: torch.Tensor, *, tree_depth: int = TREE_DEPTH) -> torch.Tensor:
    """:func:`det_gemm_kernel` on ``cuda_bf16``."""
    return _det_gemm(a, b, tree_depth, False, "cuda_bf16")


def det_gemm_triton_fp32_merge(a: torch.Tensor, b: torch.Tensor, *, tree_depth: int = TREE_DEPTH) -> torch.Tensor:
    """KNOWN-BREAKING control (not for use): the same tree with FP32 leaves and FP32 merges, one
    rounding at the end (Option A). A K split merged in BF16 cannot reproduce it, so the ``tp``
    transform must catch it. a: [M, K] bfloat16, b: [K, N] bfloat16 -> [M, N] bfloat16."""
    return _det_gemm(a, b, tree_depth, True, "triton_cuda_bf16")


def det_gemm_triton_depth_from_m(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KNOWN-BREAKING control (not for use): a size-dependent configuration whose tree depth is
    chosen from M (0 for M = 1, 1 for M in 2..3, 2 from M = 4). Row bits then depend on the batch
    size, so the ``batch`` transform must catch it. a: [M, K] bfloat16, b: [K, N] bfloat16 ->
    [M, N] bfloat16."""
    m = a.shape[0] if isinstance(a, torch.Tensor) and a.dim() == 2 else 1
    depth = min(TREE_DEPTH, max(m, 1).bit_length() - 1)
    return _det_gemm(a, b, depth, False, "triton_cuda_bf16")




def merge_bf16(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The contract's merge ``bf16(fp32(left) + fp32(right))`` (what a 2-rank BF16 all-reduce does)."""
    return (left.float() + right.float()).to(torch.bfloat16)


def _accepts_tree_depth(impl: Callable[..., torch.Tensor]) -> bool:
    try:
        return "tree_depth" in inspect.signature(impl).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


def tp_split_det_gemm(a: torch.Tensor, b: torch.Tensor, parts: int,
                      impl: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``a @ b`` as a simulated tensor-parallel row-parallel layer with K split into ``parts`` ranks.

    a: [M, K] bfloat16, b: [K, N] bfloat16 -> [M, N] bfloat16. K is split by the mid-split rule
    into ``parts`` (a supported split of the contract: 1, 2 or 4) contiguous pieces; rank ``r``
    computes ``impl(a[:, K_r], b[K_r, :], tree_depth=tree_depth - log2(parts))`` (an ``impl``
    without a ``tree_depth`` argument is called as ``impl(a_r, b_r)``), and the partial results
    are merged in BF16 in tree order, ``((p0 + p1) + (p2 + p3))``. For an implementation of the
    declared topology this equals ``impl(a, b)`` bit for bit (the spec's ``tp`` transform).
    Differentiable when ``impl`` is.

    Raises
    ------
    InputError
        ``parts`` is not a supported split, or the operands are not 2-D with matching K.
    """
    from rl_engine.contract import load_contract

    declared = load_contract().det_gemm
    if parts not in declared["supported_splits"]:
        raise InputError(f"parts must be one of the contract's supported splits {declared['supported_splits']}, got {parts}")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2):
        raise InputError("a and b must be 2-D tensors [M, K] and [K, N]")
    if a.shape[1] != b.shape[0]:
        raise InputError(f"a is [M, K] = {list(a.shape)} but b is [K, N] = {list(b.shape)}: K differs")
    level = parts.bit_length() - 1
    depth = int(declared["tree_depth"]) - level
    bounds = mid_split_bounds(0, a.shape[1], level)
    with_depth = _accepts_tree_depth(impl)
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        a_r, b_r = a[:, lo:hi], b[lo:hi, :]
        pieces.append(impl(a=a_r, b=b_r, tree_depth=depth) if with_depth else impl(a=a_r, b=b_r))
    while len(pieces) > 1:
        pieces = [merge_bf16(pieces[i], pieces[i + 1]) for i in range(0, len(pieces), 2)]
    return pieces[0]
