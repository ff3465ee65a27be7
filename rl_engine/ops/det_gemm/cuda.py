"""CUDA C++ det_gemm (``cuda_bf16`` backend), forward and backward, with the contract's Option B tree.

Kernel ``rl_det_gemm`` in ``rl_engine/backends/cuda_src/gemm.cu``: one block of 8 warps owns one
128 x 128 output tile; BF16 operands reach shared memory in 128 x 32 tiles (any strides; 16-byte
vector loads where the layout allows, which never changes the values) and are multiplied with
WMMA 16x16x16 BF16 tensor-core tiles into FP32 accumulators.

Topology (contract ``declared_exceptions.det_gemm``, checked at every call): the K axis is split by
``mid = lo + (hi - lo) // 2`` recursively ``TREE_DEPTH = 2`` times (bounds from
:func:`rl_engine.ops.det_gemm.api.mid_split_bounds`, passed to the kernel) into four contiguous
leaves; each leaf is accumulated in FP32 over 32-wide K steps starting at the leaf's own first
index, in increasing k, and rounded to BF16; merges are ``bf16(fp32(l) + fp32(r))`` as
``((l0 + l1) + (l2 + l3))``. A tensor-parallel rank holding the K range of one subtree passes
``tree_depth = TREE_DEPTH - log2(parts)`` and runs exactly the same K steps, so a BF16 merge of the
ranks equals the unsplit product bit for bit.

Leaf-parallel form (``rl_det_gemm_leaves``): for outputs of fewer than ``LEAF_SPLIT_BELOW_TILES``
tiles (decode), one block per (tile, leaf) runs the same leaf loop into a BF16 workspace and a
second kernel applies the same merges; same bits, ``2^depth`` times the blocks. At decode sizes
(M <= 64, unit stride along K) the leaves are streamed GEMVs that run the same 32-wide steps with
``mma.sync`` / WMMA: the warp GEMV for M <= 16 (the block merges its leaves, one launch), the ring
(``gemv_leaf_kernel``) when that is off, and the tile form (``gemv_tile_kernel``) for M > 16
(:data:`GEMV_VARIANTS`).

Pipelined forms (:data:`TREE_GEMM_FORMS`, :func:`set_tree_gemm_form`; ``gemm_pipe.cu`` picks one, ``gemm_pipe.cuh`` has the kernels):
``tree_pipe_kernel`` runs the same leaves, steps and k16 products from a cp.async ring with ldmatrix +
mma.sync, ``tree_wgmma_kernel`` with the warpgroup MMA (same bits on the H200; the warpgroup form is
the default).
Batch invariance: output ``(m, n)`` is computed from row m of ``a`` and column n of ``b`` by the
same MMA sequence whatever M, the row's position in its tile, or the operand strides.

Backward (deterministic, no atomics): ``da = dc @ b^T`` and ``db = a^T @ dc`` by the same kernel on
transposed views, with the full ``TREE_DEPTH`` tree over their own reduction axis.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch
from rl_engine.ops.det_gemm.topology import mid_split_bounds

TREE_DEPTH = 2
"""Depth of the K tree; must equal the contract's ``declared_exceptions.det_gemm.tree_depth``."""


TILE = 128
"""Output tile of the kernel (rows and columns)."""

LEAF_SPLIT_BELOW_TILES = 264
"""The leaf-parallel form (``rl_det_gemm_leaves``) runs when the output has fewer 128 x 128 tiles
than this (twice the H200's 132 SMs), e.g. every decode-step projection. It runs the same leaf
loops and merges as the fused kernel, so the bits are the same (tested); the choice depends only
on M and N."""


GEMV_VARIANTS = 12
"""Geometries of the decode GEMV for the ring and merge path (M <= 64). Ring (``gemv_leaf_kernel``:
32-wide K steps per slot, slots): 0, the default, = (4, 2) with each thread's copy sources worked
out once per block up to M = 16 (the fastest ring on the H200 at every Qwen3-8B shape and M in
{1, 16, 64}, ``evidence/2026-12-02-h200-decode-80982b6``, where it was numbered 5), and from M = 17
up the warpgroup form 10 on the GPU (at M = 64 137 us over the four products against 197 us for the
tile form 6, ``evidence/2026-12-02-h200-decode-9b35315``) or the tile form 6 in the host emulation;
1 = (2, 4); 2 = (2, 6);
3 = (1, 8); 4 = (4, 4); 5 = (4, 2) with the sources recomputed per slot. Tile form
(``gemv_tile_kernel``: a warp owns a 16 MF x 32 or 16 MF x 16 tile, loads its A rows once per step
for all of it by ldmatrix and multiplies with mma.sync; each thread's copy addresses worked out once
per block; warps, slots of 64 k, columns per warp): 6 = (4, 4, 32), 7 = (4, 4, 16), 8 = (4, 6, 16).
They differ only in which warp computes which outputs, how much of the weight is in flight, how
many blocks fit an SM and how the copy addresses are formed; the steps, their order and the MMA
instructions are the same, so the bits are (tested). Warpgroup form (``gemv_wgmma_kernel``, the GPU
only: one warpgroup per 64 x 64 tile of one leaf, wgmma m64n64k16 from shared memory, the same k16
products in the same order; copy addresses worked out once per block): 9 = 4 slots of 64 k and the
merge launch, 10 = 4 slots with the leaf merge inside a 1 x leaves thread-block cluster (the merge
kernel's expressions through distributed shared memory: no merge launch, no workspace), 11 = 6
slots with the cluster merge."""

TILE_GEMV_VARIANTS = (6, 7, 8)
"""The tile form's geometries among :data:`GEMV_VARIANTS`."""

WGMMA_GEMV_VARIANTS = (9, 10, 11)
"""The warpgroup form's variants among :data:`GEMV_VARIANTS`. The host emulation has no warpgroup
MMA or clusters: there they fail with cudaErrorNotSupported, and the tests run them on the GPU only."""


WARP_GEMV_ON_CUDA = True
"""Whether decode products with M <= 16 take the warp-streamed GEMV (``gemv_warp_kernel``: each
warp streams its columns of one leaf through its own cp.async ring, the block merges the leaves:
one launch, no workspace) instead of the ring GEMV and a merge launch. The same bits (tested in the
host emulation at every M from 1 to 16, depth 1 and 2, and on the H200). Calls can ask for either
form (``warp_gemv=``)."""


def set_gemv_variant(variant: int) -> int:
    """Make every later decode GEMV of this process use ring ``variant`` (for
    ``tools/gemv_compare.py --variants``); returns the previous one.

    Raises
    ------
    InputError
        ``variant`` not in ``[0, GEMV_VARIANTS)``.
    """
    return _set_variant("gemv variant", "rl_gemv_variant", variant, GEMV_VARIANTS)


def _set_variant(what: str, export: str, variant: int, count: int, first: int = 0) -> int:
    """Check ``variant`` against ``[first, count)`` (InputError naming ``what``) and pass it to the
    library's ``export``, which returns the previous one."""
    from rl_engine.backends.cuda_launch import query
    from rl_engine.errors import InputError

    if isinstance(variant, bool) or not isinstance(variant, int) or not first <= variant < count:
        raise InputError(f"{what}: expected an integer in [{first}, {count}), got {variant!r}")
    return query(export, variant)


TILE_GEMV_MIN_M = 8
"""The row count from which det_gemm's leaf-parallel decode GEMV and the FP32 logits GEMV take the
warpgroup form (the tile form in the host emulation) by default (``GV_TILE_MIN_M``,
``GV_TILE_DEFAULT`` in ``gemm.cu``); below it, the warp GEMV or the ring. On the H200 the Qwen3-8B
step was faster with the warpgroup form at B = 8 and 16 and slower at B = 1
(``evidence/2026-12-02-h200-decode-9b35315``)."""


def set_tile_gemv_min_m(m: int) -> int:
    """Make every later leaf-parallel decode GEMV of this process with at least ``m`` rows take the
    default form of :data:`TILE_GEMV_MIN_M` and up (in place of the warp GEMV or the ring); returns the
    previous value. For ``tools/decode_profile.py --tile-gemv-min-m``: the bits do not depend on it.

    Raises
    ------
    InputError
        ``m`` not in ``[1, 66)``.
    """
    return _set_variant("tile gemv min m", "rl_gemv_tile_min_m", m, 66, first=1)


WARP_GEMV_VARIANTS = 6
"""Geometries of the warp GEMV (``gemv_warp_kernel``: 8-column groups per warp, ring slots at M <= 8
and at M <= 16): 1 = (2, 3, 2); 2 = (2, 2, 2); 3 = (4, 3, 2); 4 = (1, 6, 4); 5 = (2, 4, 3); the
default, 0, is 2's form at M <= 8 and 3's at M <= 16 (the fastest warp forms on the H200,
``evidence/2026-12-02-h200-decode-80982b6``). They differ in which warp streams which columns and
how far ahead, never in a step, its order or an instruction, so the bits are the same (tested).
Tree depth 1 always runs 5."""


def set_warp_gemv_variant(variant: int) -> int:
    """Make every later warp GEMV of this process use geometry ``variant`` (for
    ``tools/gemv_compare.py --variants``); returns the previous one.

    Raises
    ------
    InputError
        ``variant`` not in ``[0, WARP_GEMV_VARIANTS)``.
    """
    return _set_variant("warp gemv variant", "rl_gemv_warp_variant", variant, WARP_GEMV_VARIANTS)


TREE_GEMM_FORMS = 9
"""Forms of the GEMMs at training sizes (the fused tree, the leaf-parallel form's leaves where the decode
GEMVs do not run, and the FP32-output GEMM): 0 = the WMMA kernels
(``tree_gemm_kernel`` / ``tree_leaf_kernel``: one 32-wide K step at a time through shared memory,
no pipeline); 1 and 2 = ``tree_pipe_kernel``: the operands stream through a cp.async ring and are
multiplied with ldmatrix + mma.sync m16n8k16, K-contiguous or M- / N-contiguous operands alike (the
forward's ``x @ w^T`` and both backward GEMMs' transposed views), where :func:`tree_pipe_ok` holds
(else form 0 runs). Form 1: 128 x 128 tiles, 4 ring slots, the leaf sums held for the merges in
registers. Form 2: the fused tree in 128 x 256 tiles (64 x 64 per warp: half the shared-memory reads
per MMA), 3 slots, the held sums in shared memory; its leaf-parallel leaves and FP32 outputs run as
form 1. Form 3: the fused tree by ``tree_wgmma_kernel``, two warpgroups per 128 x 128 tile with wgmma m64n128k16 from
128-byte-swizzle ring slots of 64 k: K-major slots (the warpgroup GEMV's layout) for K-contiguous
operands, MN-major slots read with the instruction's transpose flag for the backward's M- / N-
contiguous ones (the layouts (K, K), (K, MN), (MN, MN) of ``x @ w^T``, ``dy @ w``, ``x^T @ dy``),
with a K-contiguous operand every leaf bound a multiple of 8; the leaf-parallel form's leaves (one block
per tile and leaf) and the FP32 logits (K, K) too; the rest as form 1. Same leaves, steps, k16 products in the same order and roundings per output element, so the same
bits (forms 1 to 3 tested against form 0 in the host emulation, whose warpgroup MMA reads the
operands through a decoder of the PTX ISA's canonical descriptor layouts). On the H200 all three gave
form 0's bits at every Qwen3-8B projection shape and product, at 0.19-0.46x cuBLAS for form 3 against
0.04-0.17x for form 0 (``evidence/2026-12-04-h200-issue33-e035223/``), so form 3 became the default
then. Form 4 (the default from fc8dac6 to 12b63cb, ``g_tree_form`` in ``gemm_pipe.cu``): form 3 with its fused trees, leaves and FP32 logits on
``tree_wgmma_ws_kernel``, warp-specialised: one warpgroup issues the copies of a six-place ring and
two only multiply, handing ring places back and forth through shared-memory barriers instead of a
block barrier per slot; same tiles, slots, k16 products and roundings (also for ``linear_logp``'s hi /
lo products, ``rl_gemm_hilo``); persistent by default (:func:`set_tree_wgmma_ws_persistent`). Written for the ncu
profile of form 3 (``evidence/2026-12-05-h200-split-decode-52da2a0/``: 0.41x cuBLAS, the tensor pipe
34 % busy, the MMA warps issuing the copies and waiting at a block barrier per slot). On an H100
(one block per tile) it gave form 0's bits at every Qwen3-8B projection shape and product, at
0.44-0.77x cuBLAS for M = 8192 against 0.32-0.45x for form 3, and the cuda_bf16 train step took
599 ms against 770; the persistent grid kept the bits and measured about even with one block per
tile (``evidence/2026-12-05-h100-det-gemm-ws-50b3bad/``). On the H200 the same bits at 0.46-0.69x
cuBLAS (M = 8192), and the whole gate with it kept every bit of the gate before
(``evidence/2026-12-06-h200-form4-fc8dac6/``, ``evidence/2026-12-06-h200-gate-fc8dac6/``). Form 5:
form 4 with the ring's copies made by TMA (one thread issues a slot as two to four tensor-map boxes
and one expect-tx arrival; a map per leaf and operand spans only the leaf's k range, so TMA's zero
fill past the tensor's edge is the leaf's zero fill past its end), written for the ncu profile of form
4 (L1/TEX 54 % busy with the copy warpgroup's cp.async); the same bytes land at the same places, the
MMA warpgroups are form 4's. Where the driver refuses a map, form 4's copies run
(:func:`form_launches` counts the launches that used TMA). On an H100 it gave form 0's bits at every
Qwen3-8B projection shape and product (168 sweep rows) at 0.50-0.76x cuBLAS for M = 8192 against
0.43-0.69x for form 4 in the same run, and the cuda_bf16 train step took 516 ms against 582
(``evidence/2026-12-06-h100-det-gemm-tma-bc88c58/``); the default since 12b63cb, whose source (as 716923f) the whole gate ran with and
kept every bit of fc8dac6's (``evidence/2026-12-06-h100-gate-716923f/``, on an H100). Form 6: form 5 with the fused BF16 trees in 128 x 256 tiles
(``tree_wgmma_wide_kernel``: each MMA warpgroup m64n256k16, ring slots of 64 k x (128 + 256) rows,
48 KB, four of them; a depth-2 tree's first merged sum parked in its output places while leaves 2 and
3 run), written for the ncu profile of form 5 (the L2 72 % busy: a slot's reads now feed twice the
products); the leaf-parallel leaves, FP32 outputs and hi / lo products run as form 5. On an H100 it
gave form 0's bits (192 sweep rows, the pipelined GPU tests) but was slower than form 5 in most
products (0.36-0.79x cuBLAS at M = 8192 against 0.51-0.77x; ``evidence/2026-12-06-h100-form5-form6-716923f/``):
halving the tile count leaves SMs idle at these shapes, and the operand reads were not the limit.
Form 7: form 5 with the depth-2 fused BF16 trees' sibling leaves side by side
(``tree_wgmma_ws_kernel``'s ``PAIR``): the ring's slots alternate between leaves 0 and 1 (then 2 and
3), each MMA warpgroup holds one accumulator per leaf, and the two leaves are rounded and merged once
both are summed: the same k16 products per accumulator in the same order, the same roundings and
merges, and half the leaf ends at which the MMA warpgroups wait for every MMA in flight. Written for
form 5's profile (the tensor pipe 64 % busy) after the Triton backend's persistent kernel gained from
the same pairing (``PersistentTiles.loop``); other depths and products run as form 5. On an H100 it
gave form 5's bits in every sweep row (``evidence/2026-12-07-h100-issue34-50f44c6/``, with the
``fence.proxy.async`` form 5 had dropped) and, in one process, the 4 x 1024 ``cuda_bf16`` train step's
kernels took 471.9 ms against form 5's 485.3 (the layer GEMMs 319.2 against 332.2 ms;
``evidence/2026-12-07-h100-chain-c163ce5/``). The default since 56d6ddf, without the fence (a
TMA-filled ring needs none): the whole gate kept every bit with it (``evidence/2026-12-07-h100-gate-56d6ddf/``,
an H100), and the chain bench's ``cuda_bf16`` / Triton tokens/s went 0.842 -> 0.874 (teacher forcing
8 x 1024), 0.867 -> 0.891 (2 x 8192) and 0.910 -> 0.943 (train step;
``evidence/2026-12-07-h100-chain-56d6ddf/``).
Form 8: form 5 with the depth-2 fused BF16 trees' leaves rolled (``tree_wgmma_ws_kernel``'s ``ROLL``):
the leaves run one after another in form 5's slot order, leaf ``l`` summed into accumulator ``l % 2``,
and a leaf is rounded and merged (leaf 2's rounded sums parked in shared memory) only after the next
leaf's first slot has been issued, a tile's last leaf and its store after the next tile's first slot:
the same products per accumulator in the same order, the same roundings and merges, and no wait for
every MMA in flight but at an empty leaf and after a block's last tile (form 7 waits at two per
tile). Written for the ncu pair of form 7 and Triton's kernel on the q projection (the tensor pipe
65.5 % against 74.5 % busy, ``evidence/2026-12-07-h100-chain-56d6ddf/``); other depths and products
run as form 5. On an H100 (``evidence/2026-12-07-h100-chain-8c1568c/``) its bits equal the WMMA form's
(``test_det_gemm_pipelined_form_equals_wmma_form``, up to 1024 x 4096 x 4096) but it is slower: the layer
GEMMs of 8 x 1024-token teacher forcing took 242.5 ms against form 7's 209.0 in the same process. Kept
for the record and the tests; not the default."""


def set_tree_gemm_form(form: int) -> int:
    """Make every later training-size GEMM of this process use ``form`` (:data:`TREE_GEMM_FORMS`);
    returns the previous one. For the tests, ``tools/det_gemm_prefill_sweep.py --cuda-forms`` and
    ``tools/train_step_profile.py --cuda-forms``: the bits do not depend on the form.

    Raises
    ------
    InputError
        ``form`` not in ``[0, TREE_GEMM_FORMS)``.
    """
    return _set_variant("tree gemm form", "rl_tree_gemm_form", form, TREE_GEMM_FORMS)


def set_tree_wgmma_ws_persistent(on: int) -> int:
    """The grid of forms 4-6 for every later launch of this process: 1 (the default) one block per SM, each
    looping over tiles in the grouped order with the ring running on from tile to tile; 0 one block per
    tile. Returns the previous setting. For the tests and the timing tools: the bits do not depend on it.

    Raises
    ------
    InputError
        ``on`` not 0 or 1.
    """
    return _set_variant("form 4 persistent grid", "rl_tree_wgmma_ws_persistent", on, 2)


def form_launches(form: int) -> int:
    """How many launches of this process ran form ``form``'s own kernel: 5, the warp-specialised kernel
    with TMA copies (form 7's and 8's launches included); 6, the 128 x 256 tiles; 7, the paired sibling
    leaves; 8, the rolled leaves
    (for the tests: a product whose tensor maps the driver refuses runs form 4's copies, with the same
    bits, so a comparison of forms 5 to 7 must also see its count rise).

    Raises
    ------
    InputError
        ``form`` not 5, 6, 7 or 8.
    """
    from rl_engine.backends.cuda_launch import query
    from rl_engine.errors import InputError

    if form not in (5, 6, 7, 8) or isinstance(form, bool):
        raise InputError(f"form_launches: form must be 5, 6, 7 or 8, got {form!r}")
    return query("rl_tree_form_launches", form)


def tree_pipe_ok(a: torch.Tensor, b: torch.Tensor, depth: int) -> bool:
    """Whether the pipelined forms of :data:`TREE_GEMM_FORMS` can run ``a [M, K] @ b [K, N]`` with a
    depth-``depth`` tree (else form 0 runs): 16-byte aligned data, each operand unit-stride along K
    (then its other stride a multiple of 8 and every leaf start a multiple of 8) or along M / N (then
    its K stride a multiple of 8). Form 3 takes the warpgroup kernel where, in addition, the layout is
    one of the training step's three and, with a K-contiguous operand, every leaf bound is a multiple
    of 8 (else form 1's kernel)."""
    from rl_engine.backends.cuda_launch import query

    bounds = mid_split_bounds(0, a.shape[1], depth)
    bounds = bounds + [a.shape[1]] * (5 - len(bounds))
    return bool(query("rl_tree_pipe_ok", a.data_ptr(), b.data_ptr(), a.stride(0), a.stride(1), b.stride(0),
                      b.stride(1), depth, *bounds[:4]))


def use_leaf_split(m: int, n: int, depth: int) -> bool:
    """Whether :func:`det_gemm_launch` takes the leaf-parallel form for an ``[m, n]`` output."""
    return depth > 0 and -(-m // TILE) * -(-n // TILE) < LEAF_SPLIT_BELOW_TILES


def det_gemm_launch(a: torch.Tensor, b: torch.Tensor, depth: int, fp32_merge: bool = False,
                    leaf_split: bool | None = None, warp_gemv: bool | None = None) -> torch.Tensor:
    """C [M, N] bf16 = tree-reduced a [M, K] @ b [K, N]; any strides (no copies).

    ``leaf_split`` forces the form (None: :func:`use_leaf_split`); ``warp_gemv`` the decode GEMV of
    the leaf-parallel form for M <= 16 (None: :data:`WARP_GEMV_ON_CUDA`); tests compare them.
    ``fp32_merge`` (the Triton negative control's knob) must be False here."""
    if fp32_merge:
        raise ValueError("the FP32-merge negative control exists only for triton_cuda_bf16")
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return c
    bounds = mid_split_bounds(0, k, depth)
    bounds = bounds + [k] * (5 - len(bounds))
    if leaf_split is None:
        leaf_split = use_leaf_split(m, n, depth)
    if leaf_split:
        if depth == 0:
            raise ValueError("the leaf-parallel form needs depth >= 1")
        w = torch.empty((1 << depth, m, n), dtype=torch.bfloat16, device=a.device)
        launch(a.device, "rl_det_gemm_leaves", a, b, c, w, m, n, k, a.stride(0), a.stride(1), b.stride(0),
               b.stride(1), c.stride(0), c.stride(1), depth, *bounds, int(WARP_GEMV_ON_CUDA if warp_gemv is None else warp_gemv))
        return c
    launch(a.device, "rl_det_gemm", a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
           c.stride(0), c.stride(1), depth, *bounds)
    return c


GATE_UP_SWIGLU_FUSED = False
"""Whether :func:`det_gemm_swiglu_launch` takes the one-launch kernel (``rl_det_gemm_swiglu``) by
default where it can run. False until it has run on a GPU (its bits against det_gemm then swiglu,
and a time below theirs); the tests force it."""


def _swiglu_bounds(k: int, depth: int) -> list[int]:
    bounds = mid_split_bounds(0, k, depth)
    return bounds + [k] * (5 - len(bounds))


def det_gemm_swiglu_ok(a: torch.Tensor, b: torch.Tensor, depth: int) -> bool:
    """Whether ``rl_det_gemm_swiglu`` can run ``swiglu(a @ b[:, :F], a @ b[:, F:])`` for ``a [M, K]``
    and ``b [K, 2F]`` (bf16 on the device): a depth-2 tree, both operands unit-stride along K (``x`` and
    the packed gate / up weight ``[2F, K]`` transposed), the training-size GEMM form 5 or later,
    16-byte aligned rows and leaf bounds, and tensor maps the driver accepts."""
    from rl_engine.backends.cuda_launch import query

    m, k = a.shape
    two_f = b.shape[1]
    if depth != 2 or two_f % 2 or m == 0 or k == 0 or a.stride(1) != 1 or b.stride(0) != 1:
        return False
    return query("rl_det_gemm_swiglu_ok", a.data_ptr(), b.data_ptr(), m, two_f // 2, k, a.stride(0), b.stride(1),
                 *_swiglu_bounds(k, depth)) == 1


def det_gemm_swiglu_launch(a: torch.Tensor, b: torch.Tensor, depth: int, fused: bool | None = None) -> torch.Tensor:
    """``y [M, F]`` bf16 = ``swiglu(a @ b[:, :F], a @ b[:, F:])``: a Qwen3 MLP's gate / up projections
    (``a [M, K]`` the normed hidden rows, ``b [K, 2F]`` the packed ``[gate; up]`` weight transposed,
    bf16) and SwiGLU, each product tree-reduced over K as :func:`det_gemm_launch` reduces it (FP32 leaf
    sums rounded to BF16, BF16 merges), SwiGLU in FP32 rounded once as
    :func:`rl_engine.ops.swiglu.cuda.swiglu_fwd` computes it: the same bits as those two launches
    (tested), in one launch that writes neither projection where ``fused`` (None:
    :data:`GATE_UP_SWIGLU_FUSED` and :func:`det_gemm_swiglu_ok`) says so.

    Raises
    ------
    ValueError
        ``b``'s columns are odd (no two halves), its K is not ``a``'s, or ``fused`` is True where
        :func:`det_gemm_swiglu_ok` is False; all before any launch.
    """
    from rl_engine.ops.swiglu.cuda import swiglu_fwd

    m, k = a.shape
    if b.shape[0] != k or b.shape[1] % 2:
        raise ValueError(f"det_gemm_swiglu: b must be [K, 2F] with K = {k}, got {list(b.shape)}")
    ffn = b.shape[1] // 2
    if fused is None:  # (the capability query builds tensor maps on the host: asked only when it matters)
        fused = GATE_UP_SWIGLU_FUSED and det_gemm_swiglu_ok(a, b, depth)
    elif fused and not det_gemm_swiglu_ok(a, b, depth):
        raise ValueError("det_gemm_swiglu: the one-launch kernel cannot run these operands (det_gemm_swiglu_ok)")
    if not fused:
        gu = det_gemm_launch(a, b, depth)
        return swiglu_fwd(gu[:, :ffn], gu[:, ffn:])
    y = torch.empty((m, ffn), dtype=torch.bfloat16, device=a.device)
    launch(a.device, "rl_det_gemm_swiglu", a, b, y, m, ffn, k, a.stride(0), b.stride(1), y.stride(0),
           *_swiglu_bounds(k, depth))
    return y


def swiglu_launches() -> int:
    """How many launches of this process ran ``rl_det_gemm_swiglu``'s kernel (for the tests)."""
    from rl_engine.backends.cuda_launch import query

    return query("rl_det_gemm_swiglu_launches")
