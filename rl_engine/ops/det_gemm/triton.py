"""Triton det_gemm, forward and backward, with the contract's Option B K tree.

Topology (contract ``declared_exceptions.det_gemm``, asserted at every call): the K axis is split
by ``mid = lo + (hi - lo) // 2`` recursively ``tree_depth`` times (``TREE_DEPTH = 2``) into
contiguous leaves ``[0, k1) [k1, k2) [k2, k3) [k3, K)``. One program owns one ``[BM, BN]`` output
tile and walks the leaves in order: each leaf is accumulated in an FP32 register tile over
``BK``-wide blocks in increasing k (``tl.dot`` through :func:`mma`; the blocks start at the leaf's
own start and are masked at its end, so leaf bounds need not be multiples of ``BK``), then rounded
to BF16; merges are ``bf16(fp32(l) + fp32(r))`` as ``((l0 + l1) + (l2 + l3))``. A pending left
operand (``l0``, ``l2``) is parked in a BF16 workspace ``[M, N]`` and ``l0 + l1`` in the output
buffer, so only one FP32 accumulator is live in registers during each leaf loop (holding the BF16
partials in registers ran at 0.3x cuBLAS on H200; parking them, 0.63-0.77x at M = 4096).

Leaf-parallel form (decode): when the output has fewer than ``LEAF_SPLIT_BELOW_TILES`` tiles (a
decode step's GEMV has ``N / 128``), one program per (tile, leaf) runs the same leaf loop, stores
the BF16 leaf in a workspace ``[2^depth, M, N]``, and the program that finishes a tile's last leaf
applies the same BF16 merges (:data:`MERGE_IN_LEAVES_ON_CUDA`; a second merge kernel where that
cannot run); ``2^depth`` times as many programs stream the weight. Same instructions per leaf, same roundings,
same bits as the fused form (tested on random inputs); the choice depends only on M and N.

Decode tiles: for M <= 16 the leaf-parallel form runs ``[16, 128]`` tiles (``[16, 64]`` for
N < 4096), for 16 < M <= 64 ``[64, 64]`` tiles (:func:`leaf_tiles`); the tile shape changes which program computes an element, never the
element's BK blocks, order or roundings (tested: same bits, on the H200 too).

Tile configuration of the fused form, fixed for every M, N and K (never derived from the problem size):
``BM = BN = 128``, ``BK = 64``, ``num_warps = 8``, ``num_stages = 4``, grouped program order with
``GROUP_M = 8`` (the order only changes which program computes a tile, not any tile's arithmetic).
Chosen by a sweep on H200 (triton 3.6): 128 x 256 tiles and 4 warps were slower; the bits of every
tested configuration were identical.

Persistent form (training shapes, Hopper): :func:`_det_gemm_persistent_kernel` runs the same leaves
with TMA loads in a persistent grid (one program per SM walking tiles), two sibling leaves
accumulated side by side in one pipelined block loop and the pending pair in registers; it applies
when every leaf is a whole number of ``BK`` blocks (``K % (BK << depth) == 0``) and both operands
are TMA-readable, and runs for outputs of >= 512 tiles, >= 256 tiles with K >= 4096, or >= 128
tiles with K >= 8192 (:func:`use_persistent`; the leaf-parallel form only below M = 1024). Same blocks, order and
roundings as the fused form, same bits (tested on every Qwen3-8B training product on the H200).

Batch invariance: output element ``(m, n)`` is computed by one program from row ``m`` of ``a``
and column ``n`` of ``b`` with instructions that do not depend on M or on the tile's other rows,
so a row's bits do not depend on M, on its neighbours, or on the strides of the operands.

Tensor parallelism: a rank holding the K range of one subtree runs ``tree_depth - log2(parts)``
(``det_gemm_triton(a_r, b_r, tree_depth=1)`` for TP=2, ``0`` for TP=4); its blocks start at the
same global k as in the unsplit run, so it reproduces that subtree bit for bit, and a BF16 merge
of the ranks equals the unsplit product (:func:`rl_engine.ops.det_gemm.tp_split_det_gemm`).

Backward (deterministic, no atomics): ``da [M, K] = dc @ b^T`` and ``db [K, N] = a^T @ dc``, both by
this same kernel on strided (transposed) views with the full ``TREE_DEPTH`` tree over their own
reduction axis (N for da, M for db), which TP does not split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, div_ieee, exp_ieee, gpu_facts, mma, tma_layout, upcast_dots
from rl_engine.ops.det_gemm.topology import mid_split_bounds

TREE_DEPTH = 2
"""Depth of the K tree; must equal the contract's ``declared_exceptions.det_gemm.tree_depth``."""

BM = 128
BN = 128
BK = 64
GROUP_M = 8
NUM_WARPS = 8
NUM_STAGES = 4


@triton.jit
def _leaf(a_rows, b_cols, lo, hi, s_ak, s_bk, a_step, b_step,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
    """FP32 sum over k in [lo, hi) of a[rows, k] * b[k, cols], in BK blocks starting at lo.

    ``a_rows`` [BM, 1] and ``b_cols`` [1, BN] are pointers to the tile's rows of a and columns of
    b; ``a_step = BK * s_ak`` and ``b_step = BK * s_bk`` advance them by one block.
    """
    rk = tl.arange(0, BK)
    ks = (lo + rk).to(tl.int64)
    a_ptrs = a_rows + ks[None, :] * s_ak
    b_ptrs = b_cols + ks[:, None] * s_bk
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(lo, hi, BK):
        k_ok = rk < hi - k0
        a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = mma(a, b, acc, UPCAST)
        a_ptrs += a_step
        b_ptrs += b_step
    return acc


@triton.jit
def _settle(x, FP32_MERGE: tl.constexpr):
    """A leaf or merge result: rounded to BF16 (the contract), or kept FP32 (the control variant)."""
    if FP32_MERGE:
        return x
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _merge(left, right, FP32_MERGE: tl.constexpr):
    return _settle(left.to(tl.float32) + right.to(tl.float32), FP32_MERGE)


@triton.jit
def _det_gemm_kernel(a_ptr, b_ptr, c_ptr, w_ptr, s_ptr, M, N, K, k1, k2, k3,
                     s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_sm, s_sn, a_step, b_step,
                     DEPTH: tl.constexpr, FP32_MERGE: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                     UPCAST: tl.constexpr):
    """c = tree-reduced a @ b for one [BM, BN] tile.

    Pending partial results are parked in memory owned by this tile instead of registers (a left
    leaf in the workspace ``w``, the left subtree ``l0 + l1`` in ``s``, which is ``c`` itself on the
    contract path), so each leaf loop runs with only its FP32 accumulator live; values round-trip
    exactly (BF16 stored as BF16). ``tl.debug_barrier`` orders one thread's store before another
    thread's load of the same tile.
    """
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    # Rows/columns past the edge load a valid (wrapped) row/column instead of being masked; their
    # results are never stored, and no output element reads another row or column.
    a_rows = a_ptr + (rows % M).to(tl.int64)[:, None] * s_am
    b_cols = b_ptr + (cols % N).to(tl.int64)[None, :] * s_bn
    ok = (rows < M)[:, None] & (cols < N)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    c64 = cols.to(tl.int64)[None, :]
    c_ptrs = c_ptr + r64 * s_cm + c64 * s_cn
    w_ptrs = w_ptr + r64 * N + c64
    s_ptrs = s_ptr + r64 * s_sm + c64 * s_sn

    if DEPTH == 0:
        out = _settle(_leaf(a_rows, b_cols, 0, K, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST), FP32_MERGE)
    elif DEPTH == 1:
        l0 = _settle(_leaf(a_rows, b_cols, 0, k2, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST), FP32_MERGE)
        tl.store(w_ptrs, l0, mask=ok)
        l1 = _settle(_leaf(a_rows, b_cols, k2, K, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST), FP32_MERGE)
        tl.debug_barrier()
        out = _merge(tl.load(w_ptrs, mask=ok, other=0.0), l1, FP32_MERGE)
    else:
        l0 = _settle(_leaf(a_rows, b_cols, 0, k1, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST), FP32_MERGE)
        tl.store(w_ptrs, l0, mask=ok)
        l1 = _settle(_leaf(a_rows, b_cols, k1, k2, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST), FP32_MERGE)
        tl.debug_barrier()
        s01 = _merge(tl.load(w_ptrs, mask=ok, other=0.0), l1, FP32_MERGE)
        tl.store(s_ptrs, s01, mask=ok)
        l2 = _settle(_leaf(a_rows, b_cols, k2, k3, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST), FP32_MERGE)
        tl.debug_barrier()
        tl.store(w_ptrs, l2, mask=ok)
        l3 = _settle(_leaf(a_rows, b_cols, k3, K, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST), FP32_MERGE)
        tl.debug_barrier()
        s23 = _merge(tl.load(w_ptrs, mask=ok, other=0.0), l3, FP32_MERGE)
        out = _merge(tl.load(s_ptrs, mask=ok, other=0.0), s23, FP32_MERGE)
        tl.debug_barrier()

    tl.store(c_ptrs, out.to(tl.bfloat16), mask=ok)


@triton.jit
def _tile_offsets(tile, tiles_m, tiles_n, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """First row and column of output tile ``tile`` in the grouped order of :func:`_det_gemm_kernel`."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return (first_m + (tile % per_group) % group_rows) * BM, ((tile % per_group) // group_rows) * BN


@triton.jit
def _load_block(a_desc, b_desc, off_m, off_n, k, A_T: tl.constexpr, B_T: tl.constexpr):
    """The ``[BM, BK]`` block of a and the ``[BK, BN]`` block of b at ``k`` through their descriptors."""
    if A_T:
        a = a_desc.load([k, off_m]).T
    else:
        a = a_desc.load([off_m, k])
    if B_T:
        b = b_desc.load([off_n, k]).T
    else:
        b = b_desc.load([k, off_n])
    return a, b


@triton.jit
def _store_tile(out, c_ptr, M, N, s_cm, s_cn, off_m, off_n, BM: tl.constexpr, BN: tl.constexpr):
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    ok = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(c_ptr + rows.to(tl.int64)[:, None] * s_cm + cols.to(tl.int64)[None, :] * s_cn, out, mask=ok)


@triton.jit
def _emit_tile(out, c_ptr, c_desc, M, N, s_cm, s_cn, off_m, off_n, BM: tl.constexpr, BN: tl.constexpr,
               C_TMA: tl.constexpr, C_SPLIT: tl.constexpr):
    """Store a finished ``[BM, BN]`` tile: through the TMA descriptor ``c_desc`` in ``C_SPLIT``
    column slices of ``BN // C_SPLIT`` (``C_TMA``), or by :func:`_store_tile`. The same values."""
    if C_TMA:
        if C_SPLIT == 2:
            left, right = out.reshape(BM, 2, BN // 2).permute(0, 2, 1).split()
            c_desc.store([off_m, off_n], left)
            c_desc.store([off_m, off_n + BN // 2], right)
        else:
            tl.static_assert(C_SPLIT == 1, "the tile leaves whole or in two column halves")
            c_desc.store([off_m, off_n], out)
    else:
        _store_tile(out, c_ptr, M, N, s_cm, s_cn, off_m, off_n, BM, BN)


@triton.jit
def _park_in_memory(acc, leaf, c_ptr, w_ptr, M, N, s_cm, s_cn, off_m, off_n,
                    DEPTH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Round a finished leaf to BF16 and park it or merge it in memory, as :func:`_det_gemm_kernel`
    does: even leaves wait in ``w [M, N]``, leaf 1 makes ``l0 + l1`` in ``c``, leaf 3 makes
    ``(l0 + l1) + (l2 + l3)`` in ``c``. A CTA barrier orders the threads' stores and loads."""
    part = acc.to(tl.bfloat16)
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    ok = (rows < M)[:, None] & (cols < N)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    c64 = cols.to(tl.int64)[None, :]
    c_ptrs = c_ptr + r64 * s_cm + c64 * s_cn
    w_ptrs = w_ptr + r64 * N + c64
    tl.debug_barrier()  # the previous leaf's loads of this tile's parked values precede any store
    if DEPTH == 0:
        tl.store(c_ptrs, part, mask=ok)
    elif leaf % 2 == 0:
        tl.store(w_ptrs, part, mask=ok)
    else:
        pair = _merge(tl.load(w_ptrs, mask=ok, other=0.0), part, False)
        if DEPTH == 1:
            tl.store(c_ptrs, pair, mask=ok)
        elif leaf == 1:
            tl.store(c_ptrs, pair, mask=ok)
        else:
            tl.store(c_ptrs, _merge(tl.load(c_ptrs, mask=ok, other=0.0), pair, False), mask=ok)


@triton.jit
def _park_in_registers(acc, leaf, left, pair, c_ptr, M, N, s_cm, s_cn, off_m, off_n,
                       DEPTH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The same roundings and merges with the pending values in registers: ``left`` holds the last
    even leaf (BF16), ``pair`` the merged ``l0 + l1``; the tile is stored once, at its last leaf.
    Returns the new ``(left, pair)``. No thread reads another thread's store, so no barrier."""
    part = acc.to(tl.bfloat16)
    if DEPTH == 0:
        _store_tile(part, c_ptr, M, N, s_cm, s_cn, off_m, off_n, BM, BN)
    elif leaf % 2 == 0:
        left = part
    elif DEPTH == 1:
        _store_tile(_merge(left, part, False), c_ptr, M, N, s_cm, s_cn, off_m, off_n, BM, BN)
    elif leaf == 1:
        pair = _merge(left, part, False)
    else:
        _store_tile(_merge(pair, _merge(left, part, False), False), c_ptr, M, N, s_cm, s_cn, off_m, off_n, BM, BN)
    return left, pair


@triton.jit
def _det_gemm_persistent_kernel(a_desc, b_desc, c_ptr, w_ptr, M, N, K, s_cm, s_cn,
                                A_T: tl.constexpr, B_T: tl.constexpr, DEPTH: tl.constexpr,
                                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                                PROGRAMS: tl.constexpr, LOOP: tl.constexpr, REGS: tl.constexpr,
                                UPCAST: tl.constexpr, WS: tl.constexpr = False, c_desc=None,
                                C_TMA: tl.constexpr = False, C_SPLIT: tl.constexpr = 1, FLAT: tl.constexpr = False):
    """The same tree as :func:`_det_gemm_kernel`, persistent, with TMA loads (Hopper).

    ``PROGRAMS`` programs walk the output tiles in the grouped order (program ``p`` takes tiles
    ``p, p + PROGRAMS, ...``) and each tile's ``2^DEPTH`` leaves in order. ``LOOP`` = 4: one block
    loop per tile advances all ``2^DEPTH`` leaves together, each in its own FP32 accumulator (the
    pipeline fills once per tile, not once per leaf; four accumulators live); 3: the same for two
    sibling leaves at a time (``l0, l1`` then ``l2, l3``); at ``DEPTH`` = 0 both run the nest. ``WS``
    (``LOOP`` 3): the item loop is warp-specialised by the compiler (``tl.range(warp_specialize=True)``:
    producer warps issue the TMA loads, consumer warps the MMAs); the same MMAs in the same order
    into the same accumulators. ``FLAT`` (``LOOP`` 3): the item loop and its block loop are fused
    into one loop by the compiler (``tl.range(flatten=True)``), so the software pipeline loads the
    next item's first blocks while the current item finishes instead of refilling at every item
    (per item: ``K / 2^DEPTH`` of the reduction, 4 blocks for K = 1024); the same blocks into the
    same accumulators in the same order, the merges and stores in a branch at each item's last
    block. ``C_TMA`` (``LOOP`` 3): finished tiles leave through ``c_desc``, a TMA
    descriptor of ``c`` with ``[BM, BN // C_SPLIT]`` blocks (the tile stored in ``C_SPLIT`` column
    slices, so the staging buffer in shared memory is that much smaller), instead of a masked store
    from registers; the TMA unit drops what lies past M / N. The same values. ``LOOP`` = 2: one loop
    over every ``BK`` block of the program's tiles, the leaf's rounding and parking in a branch at
    its last block, so the software pipeline keeps loading the next leaf's (and the next tile's)
    blocks across leaf boundaries; 1: a loop over (tile, leaf) items around the block loop, fused
    by the compiler (``tl.range(flatten=True)``); 0: the same nest unfused. ``REGS``: pending
    leaves wait in registers (:func:`_park_in_registers`), else in memory behind a CTA barrier
    (:func:`_park_in_memory`; a barrier inside the loop stops the pipelining of ``LOOP`` 1 and 2).
    The K axis must split into ``2^DEPTH`` leaves of whole ``BK`` blocks (``K % (BK << DEPTH) ==
    0``, checked by the launcher): every leaf then starts on a block boundary and has no tail, so
    the blocks, their order and every rounding are those of :func:`_leaf` in the other forms
    (tested bit for bit). ``a_desc`` / ``b_desc`` are TMA descriptors of ``a [M, K]`` / ``b [K, N]``
    in their stored layout: ``A_T`` (``B_T``) means the descriptor holds ``a^T [K, M]``
    (``b^T [N, K]``) and the loaded block is transposed in shared memory, as the backward
    products' strided views need. Rows and columns past M / N are zero-filled by the TMA unit and
    never stored."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    leaf_blocks = K // (BK << DEPTH)
    my_tiles = tl.cdiv(tiles_m * tiles_n - pid, PROGRAMS)
    left = tl.zeros((BM, BN), dtype=tl.bfloat16)
    pair = tl.zeros((BM, BN), dtype=tl.bfloat16)
    if LOOP == 2:
        tile_blocks = leaf_blocks << DEPTH
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for it in range(0, my_tiles * tile_blocks):
            kb = it % tile_blocks
            off_m, off_n = _tile_offsets(pid + (it // tile_blocks) * PROGRAMS, tiles_m, tiles_n, BM, BN, GROUP_M)
            a, b = _load_block(a_desc, b_desc, off_m, off_n, kb * BK, A_T, B_T)
            acc = mma(a, b, acc, UPCAST)
            if (kb + 1) % leaf_blocks == 0:
                if REGS:
                    left, pair = _park_in_registers(acc, kb // leaf_blocks, left, pair, c_ptr, M, N, s_cm, s_cn,
                                                    off_m, off_n, DEPTH, BM, BN)
                else:
                    _park_in_memory(acc, kb // leaf_blocks, c_ptr, w_ptr, M, N, s_cm, s_cn, off_m, off_n, DEPTH,
                                    BM, BN)
                acc = tl.zeros((BM, BN), dtype=tl.float32)
    elif LOOP >= 3 and DEPTH > 0:
        # Sibling leaves side by side: one block loop runs 2 (LOOP 3) or all 2^DEPTH (LOOP 4) leaves
        # of a tile at once, each leaf into its own FP32 accumulator over its own blocks in
        # increasing k, so the pipeline restarts once per group of leaves instead of once per leaf.
        tl.static_assert(DEPTH <= 2, "loops 3 and 4 merge a tree of at most two levels")
        SIDE: tl.constexpr = 2 if LOOP == 3 else (1 << DEPTH)
        GROUPS: tl.constexpr = (1 << DEPTH) // SIDE
        leaf_k = leaf_blocks * BK
        for item in tl.range(0, my_tiles * GROUPS, warp_specialize=WS, flatten=FLAT):
            grp = item % GROUPS
            off_m, off_n = _tile_offsets(pid + (item // GROUPS) * PROGRAMS, tiles_m, tiles_n, BM, BN, GROUP_M)
            k0 = grp * SIDE * leaf_k
            acc0 = tl.zeros((BM, BN), dtype=tl.float32)
            acc1 = tl.zeros((BM, BN), dtype=tl.float32)
            acc2 = tl.zeros((BM, BN), dtype=tl.float32)
            acc3 = tl.zeros((BM, BN), dtype=tl.float32)
            for kb in range(leaf_blocks):
                a, b = _load_block(a_desc, b_desc, off_m, off_n, k0 + kb * BK, A_T, B_T)
                acc0 = mma(a, b, acc0, UPCAST)
                a, b = _load_block(a_desc, b_desc, off_m, off_n, k0 + leaf_k + kb * BK, A_T, B_T)
                acc1 = mma(a, b, acc1, UPCAST)
                if SIDE == 4:
                    a, b = _load_block(a_desc, b_desc, off_m, off_n, k0 + 2 * leaf_k + kb * BK, A_T, B_T)
                    acc2 = mma(a, b, acc2, UPCAST)
                    a, b = _load_block(a_desc, b_desc, off_m, off_n, k0 + 3 * leaf_k + kb * BK, A_T, B_T)
                    acc3 = mma(a, b, acc3, UPCAST)
            sib = _merge(acc0.to(tl.bfloat16), acc1.to(tl.bfloat16), False)
            if SIDE == 4:
                _emit_tile(_merge(sib, _merge(acc2.to(tl.bfloat16), acc3.to(tl.bfloat16), False), False),
                           c_ptr, c_desc, M, N, s_cm, s_cn, off_m, off_n, BM, BN, C_TMA, C_SPLIT)
            elif DEPTH == 1:
                _emit_tile(sib, c_ptr, c_desc, M, N, s_cm, s_cn, off_m, off_n, BM, BN, C_TMA, C_SPLIT)
            elif grp == 0:
                pair = sib
            else:
                _emit_tile(_merge(pair, sib, False), c_ptr, c_desc, M, N, s_cm, s_cn, off_m, off_n, BM, BN, C_TMA,
                           C_SPLIT)
    else:
        for item in tl.range(0, my_tiles << DEPTH, flatten=LOOP == 1):
            leaf = item % (1 << DEPTH)
            off_m, off_n = _tile_offsets(pid + (item >> DEPTH) * PROGRAMS, tiles_m, tiles_n, BM, BN, GROUP_M)
            k0 = leaf * leaf_blocks * BK
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for kb in range(leaf_blocks):
                a, b = _load_block(a_desc, b_desc, off_m, off_n, k0 + kb * BK, A_T, B_T)
                acc = mma(a, b, acc, UPCAST)
            if REGS:
                left, pair = _park_in_registers(acc, leaf, left, pair, c_ptr, M, N, s_cm, s_cn, off_m, off_n, DEPTH,
                                                BM, BN)
            else:
                _park_in_memory(acc, leaf, c_ptr, w_ptr, M, N, s_cm, s_cn, off_m, off_n, DEPTH, BM, BN)


@triton.jit
def _tree_tile(a_desc, b_desc, off_m, off_n, leaf_blocks, A_T: tl.constexpr, B_T: tl.constexpr,
               DEPTH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
    """The merged BF16 ``[BM, BN]`` tile at ``(off_m, off_n)``: the leaves in the order of
    :func:`_det_gemm_persistent_kernel`'s ``LOOP`` 3 (two sibling leaves side by side, each in its
    own FP32 accumulator over its own blocks in increasing k, rounded to BF16, then the declared
    BF16 merges ``l0 + l1``, ``(l0 + l1) + (l2 + l3)``)."""
    leaf_k = leaf_blocks * BK
    acc0 = tl.zeros((BM, BN), dtype=tl.float32)
    acc1 = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(leaf_blocks):
        a, b = _load_block(a_desc, b_desc, off_m, off_n, kb * BK, A_T, B_T)
        acc0 = mma(a, b, acc0, UPCAST)
        if DEPTH > 0:
            a, b = _load_block(a_desc, b_desc, off_m, off_n, leaf_k + kb * BK, A_T, B_T)
            acc1 = mma(a, b, acc1, UPCAST)
    if DEPTH == 0:
        out = acc0.to(tl.bfloat16)
    else:
        out = _merge(acc0.to(tl.bfloat16), acc1.to(tl.bfloat16), False)
        if DEPTH == 2:
            acc0 = tl.zeros((BM, BN), dtype=tl.float32)
            acc1 = tl.zeros((BM, BN), dtype=tl.float32)
            for kb in range(leaf_blocks):
                a, b = _load_block(a_desc, b_desc, off_m, off_n, 2 * leaf_k + kb * BK, A_T, B_T)
                acc0 = mma(a, b, acc0, UPCAST)
                a, b = _load_block(a_desc, b_desc, off_m, off_n, 3 * leaf_k + kb * BK, A_T, B_T)
                acc1 = mma(a, b, acc1, UPCAST)
            out = _merge(out, _merge(acc0.to(tl.bfloat16), acc1.to(tl.bfloat16), False), False)
    return out


@triton.jit
def _det_gemm_swiglu_kernel(a_desc, g_desc, u_desc, y_ptr, M, F, K, s_ym, s_yn,
                            A_T: tl.constexpr, B_T: tl.constexpr, DEPTH: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                            PROGRAMS: tl.constexpr, UPCAST: tl.constexpr):
    """``y [M, F] = swiglu(a @ w_gate, a @ w_up)``, both products tree-reduced over K (``a [M, K]``,
    ``w_gate``, ``w_up`` ``[K, F]`` through the descriptors ``g_desc`` / ``u_desc``, the same
    layout), persistent, with TMA loads; neither product is written.

    Program ``p`` takes the output tiles ``p, p + PROGRAMS, ...`` of ``y`` in the grouped order; per
    tile, the gate and up tiles are each :func:`_tree_tile`, the same BF16 values the det_gemm
    writes, and ``silu(g) * u`` is then computed from them exactly as
    :func:`rl_engine.ops.swiglu.triton._swiglu_fwd_kernel` does (FP32, ``expf`` and IEEE division,
    one rounding), so ``y`` has the bits of det_gemm then swiglu (tested)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(F, BN)
    leaf_blocks = K // (BK << DEPTH)
    for tile in range(pid, tiles_m * tiles_n, PROGRAMS):
        off_m, off_n = _tile_offsets(tile, tiles_m, tiles_n, BM, BN, GROUP_M)
        # the gate tile waits in BF16 (half the registers of FP32) while the up tile accumulates
        gate = _tree_tile(a_desc, g_desc, off_m, off_n, leaf_blocks, A_T, B_T, DEPTH, BM, BN, BK, UPCAST)
        up = _tree_tile(a_desc, u_desc, off_m, off_n, leaf_blocks, A_T, B_T, DEPTH, BM, BN, BK, UPCAST)
        g = gate.to(tl.float32)
        y = div_ieee(g, 1.0 + exp_ieee(-g)) * up.to(tl.float32)
        _store_tile(y.to(tl.bfloat16), y_ptr, M, F, s_ym, s_yn, off_m, off_n, BM, BN)


@triton.jit
def _det_gemm_leaves_kernel(a_ptr, b_ptr, w_ptr, c_ptr, cnt_ptr, M, N, K, k1, k2, k3,
                            s_am, s_ak, s_bk, s_bn, s_cm, s_cn, a_step, b_step,
                            DEPTH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                            UPCAST: tl.constexpr, MERGE: tl.constexpr):
    """Leaf-parallel form of the same tree: program ``(tile, leaf)`` computes one leaf of one
    ``[BM, BN]`` tile with the very :func:`_leaf` loop the fused kernel runs, rounds it to BF16 and
    stores it in ``w [2^DEPTH, M, N]``. Tiles are taken in row-major order (a tile's arithmetic does
    not depend on its order).

    ``MERGE``: the tile's last leaf to finish merges the tile (``cnt[tile]`` counts finished leaves;
    one thread adds 1 with acquire-release order after the tile's stores, and the program that
    counts the last leaf loads the ``2^DEPTH`` leaves past L1 and applies the BF16 merges, then
    sets the counter back to 0 for the next launch). Which program merges changes nothing: the
    merge reads the same BF16 leaves in the same order. Without ``MERGE``,
    :func:`_det_gemm_merge_kernel` merges in a second launch."""
    pid = tl.program_id(0)
    leaf = tl.program_id(1)
    tiles_n = tl.cdiv(N, BN)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    a_rows = a_ptr + (rows % M).to(tl.int64)[:, None] * s_am
    b_cols = b_ptr + (cols % N).to(tl.int64)[None, :] * s_bn
    ok = (rows < M)[:, None] & (cols < N)[None, :]
    if DEPTH == 1:
        lo = tl.where(leaf == 0, 0, k2)
        hi = tl.where(leaf == 0, k2, K)
    else:
        lo = tl.where(leaf == 0, 0, tl.where(leaf == 1, k1, tl.where(leaf == 2, k2, k3)))
        hi = tl.where(leaf == 0, k1, tl.where(leaf == 1, k2, tl.where(leaf == 2, k3, K)))
    part = _leaf(a_rows, b_cols, lo, hi, s_ak, s_bk, a_step, b_step, BM, BN, BK, UPCAST).to(tl.bfloat16)
    mn = tl.cast(M, tl.int64) * N  # M may arrive as the constant 1 (Triton specialises it)
    w_tile = w_ptr + rows.to(tl.int64)[:, None] * N + cols.to(tl.int64)[None, :]
    tl.store(w_tile + leaf.to(tl.int64) * mn, part, mask=ok)
    if MERGE:
        tl.debug_barrier()  # every thread's store of this leaf precedes the count
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == (1 << DEPTH) - 1:
            l0 = tl.load(w_tile, mask=ok, other=0.0, cache_modifier=".cg")
            l1 = tl.load(w_tile + mn, mask=ok, other=0.0, cache_modifier=".cg")
            out = _merge(l0, l1, False)
            if DEPTH == 2:
                l2 = tl.load(w_tile + 2 * mn, mask=ok, other=0.0, cache_modifier=".cg")
                l3 = tl.load(w_tile + 3 * mn, mask=ok, other=0.0, cache_modifier=".cg")
                out = _merge(out, _merge(l2, l3, False), False)
            c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * s_cm + cols.to(tl.int64)[None, :] * s_cn
            tl.store(c_ptrs, out, mask=ok)
            tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")


@triton.jit
def _det_gemm_merge_kernel(w_ptr, c_ptr, M, N, s_cm, s_cn, DEPTH: tl.constexpr, BLOCK: tl.constexpr):
    """c = the BF16 merges of the leaves in ``w``: ``l0 + l1`` (DEPTH 1) or ``(l0 + l1) + (l2 + l3)``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    mn = M * N
    l0 = tl.load(w_ptr + offs, mask=ok, other=0.0)
    l1 = tl.load(w_ptr + mn + offs, mask=ok, other=0.0)
    out = _merge(l0, l1, False)
    if DEPTH == 2:
        l2 = tl.load(w_ptr + 2 * mn + offs, mask=ok, other=0.0)
        l3 = tl.load(w_ptr + 3 * mn + offs, mask=ok, other=0.0)
        out = _merge(out, _merge(l2, l3, False), False)
    r = offs // N
    col = offs % N
    tl.store(c_ptr + r * s_cm + col * s_cn, out, mask=ok)


@dataclass(frozen=True)
class LeafTiles:
    """Tile configuration of the leaf-parallel form: ``[bm, bn]`` output tiles, ``BK`` fixed."""

    bm: int
    bn: int
    num_warps: int
    num_stages: int


PREFILL_TILES = LeafTiles(BM, BN, NUM_WARPS, NUM_STAGES)
DECODE_TILES = LeafTiles(16, 128, 8, 4)
"""Leaf-parallel tiles for a decode-sized output (M <= 16, N >= ``NARROW_N``): a GEMV streams the
weight; 16-row tiles stop a 1-row product from paying for 128 rows of MMA work. Only the tile shape
and the launch configuration differ from :data:`PREFILL_TILES`: the same ``BK = 64`` blocks in
increasing k inside each leaf, the same roundings and merges, so the bits are the prefill form's
(tested on random inputs; on the H200 at every Qwen3-8B projection shape,
``tests/ops/test_det_gemm.py``). Chosen by ``tools/det_gemm_decode_sweep.py`` on the H200 (kernels
timed back to back inside a CUDA graph, as in a captured decode step): 36 configurations, all with
the same bits; at M = 1 this one ran q/o 8.2 us (cuBLAS 9.7), gate/up 28.0 (26.9), down 28.8 (30.0)."""
DECODE_TILES_NARROW = LeafTiles(16, 64, 4, 4)
"""The decode tiles for a narrow output (N < ``NARROW_N``, Qwen3-8B's k/v projections, N = 1024):
128-wide tiles would leave 8 tiles x 4 leaves = 32 programs for 132 SMs; 64-wide ran 6.4 us at
M = 1 (cuBLAS 6.2) where 128-wide ran 8.1."""
NARROW_N = 4096
BATCH_DECODE_TILES = LeafTiles(64, 64, 4, 4)
"""The leaf-parallel tiles for 16 < M <= 64 (a decode step of up to 64 sequences). Chosen by
``tools/det_gemm_decode_sweep.py --ms 64`` on the H200 at b5b86f9 (25 configurations x 6 shapes,
timed inside CUDA graphs, every one with the prefill path's bits): the best geometric mean against
cuBLAS (0.92); at M = 64 q/o 9.9 us (cuBLAS 9.3, the 128 x 128 prefill tiles 11.1), gate/up 34.3
(28.5, 39.1), down 31.4 (32.5, 33.0)."""


def leaf_tiles(m: int, n: int) -> LeafTiles:
    """The leaf-parallel tile configuration for an ``[m, n]`` output (depends on nothing else)."""
    if m > BATCH_DECODE_TILES.bm:
        return PREFILL_TILES
    if m > DECODE_TILES.bm:
        return BATCH_DECODE_TILES
    return DECODE_TILES if n >= NARROW_N else DECODE_TILES_NARROW


LEAF_SPLIT_BELOW_TILES = 264
"""The leaf-parallel form runs when the fused kernel would have fewer ``[BM, BN]`` tiles than this
(twice the H200's 132 SMs): decode-sized M (a GEMV per weight read) then gets ``2^depth`` times as
many programs. Both forms run the same leaf loops and merges, so they give the same bits (tested);
the choice is a speed decision only and depends on nothing but M and N."""

MERGE_BLOCK = 1024

MERGE_IN_LEAVES_ON_CUDA = True
"""Whether the leaf-parallel form on a GPU merges each tile in the program that finishes its last
leaf (one launch instead of two per product; a decode step has four products per layer). Same
loads, merges and roundings as :func:`_det_gemm_merge_kernel` (tested: same bits, on the H200 too,
``evidence/2026-12-01-h200-decode-9575b6e/``). At batch 1 the step's det_gemm time went from
4.18 + 0.29 ms (leaves + merges) to 3.92 ms. The interpreter always merges in the leaves."""

MERGE_IN_LEAVES_MAX_M = DECODE_TILES.bm
"""The in-leaf merge runs for M up to this (the decode tiles' rows). On the H200 at M = 64 (Qwen3-8B
decode step at batch 64, ``[64, 64]`` tiles) the leaves kernel with the merge inside took 4.51 ms
per step where leaves plus merge kernel took 4.12 + 0.33 ms: the tile's last program then loads
four 64 x 64 leaves at the end of the kernel. A speed choice from M only; the bits are the same."""

COUNTER_SLOTS = 4096
"""Tile counters per stream for the in-leaf merge; a launch with more tiles merges in a second
kernel instead."""
COUNTER_STREAMS = 128
"""Streams per device with their own counters (torch hands out streams from a fixed pool, so a
process sees few distinct ones); a launch on a further stream merges in a second kernel."""

_COUNTERS: dict[str, torch.Tensor] = {}
_COUNTER_ROWS: dict[tuple[str, int], int] = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The int32 tile counters [COUNTER_SLOTS] of ``device`` and its current stream, all 0; None
    when the in-leaf merge cannot run (more than :data:`COUNTER_SLOTS` tiles, no counter row left,
    or a first launch on the device inside a CUDA-graph capture, where the zeroed buffer cannot be
    made).

    Every in-leaf-merge launch leaves its counters at 0, so a row serves every launch of its
    stream, eager or replayed from a graph. The buffer is made once per device outside any capture
    (:func:`rl_engine.graphs.capture` warms up eagerly first) and never replaced, so a captured
    launch's pointer stays valid; launches on different streams use different rows, so concurrent
    products never share a counter.
    """
    if tiles > COUNTER_SLOTS:
        return None
    dev = str(device)
    on_gpu = device.type == "cuda"
    buf = _COUNTERS.get(dev)
    if buf is None:
        if on_gpu and torch.cuda.is_current_stream_capturing():
            return None
        buf = _COUNTERS[dev] = torch.zeros((COUNTER_STREAMS, COUNTER_SLOTS), dtype=torch.int32, device=device)
    key = (dev, torch.cuda.current_stream(device).cuda_stream if on_gpu else 0)
    row = _COUNTER_ROWS.get(key)
    if row is None:
        row = sum(1 for d, _ in _COUNTER_ROWS if d == dev)
        if row >= COUNTER_STREAMS:
            return None
        _COUNTER_ROWS[key] = row
    return buf[row]


@dataclass(frozen=True)
class PersistentTiles:
    """Configuration of the persistent TMA form: ``[bm, bn]`` tiles, grouped order, the K step."""

    bm: int
    bn: int
    num_warps: int
    num_stages: int
    group_m: int
    loop: int
    """The kernel's ``LOOP``: 4 every leaf of a tile in one block loop (an accumulator each), 3 two
    sibling leaves per block loop, 2 one loop over every block (leaf ends in a branch), 1 the
    compiler's flattening of (tile, leaf) x block, 0 the nest as written."""
    regs: bool
    """The kernel's ``REGS``: pending leaves in registers (else parked in memory); loops 3 and 4
    always keep them in registers (``regs`` must be True)."""
    bk: int = BK
    """K per loaded block. The default is the other forms' ``BK``; a multiple of it (a sweep option:
    ``tools/det_gemm_prefill_sweep.py``) issues the same sequence of k16 tensor-core MMAs into the
    same accumulator, which should keep the bits on the GPU (the sweep checks; the CPU interpreter
    sums a block in another order, so there only exact sums compare)."""

    ws: bool = False
    """The kernel's ``WS``: asks the compiler to warp-specialise the item loop (loop 3 only). Triton
    3.9's Hopper pass leaves this kernel unchanged (no ``ttg.warp_specialize`` in its TTGIR, the
    same shared memory), so the H200 sweep's differences between ``w`` and ``r``
    (``evidence/2026-12-04-h200-issue33-7be11ee``: 0.47-0.97x cuBLAS against 0.63-0.94x) measure
    the sweep's own noise."""
    flat: bool = False
    """The kernel's ``FLAT``: the item loop and its block loop fused into one pipelined loop (loop 3
    only; 229 KB of shared memory on sm_90 against 197 KB, the H200 allows 227 KB)."""
    c_split: int = 0
    """0: finished tiles are stored from registers (masked); 1 or 2: through a TMA descriptor of
    the output in that many column slices (the kernel's ``C_TMA`` / ``C_SPLIT``; loop 3 only, and
    only where the output is TMA-writable, else the masked store). Shared memory on sm_90 at the
    default tiles: 197 KB masked, 213 KB in halves, 229 KB whole (the H200 allows 227 KB). Same bits
    on the H200; not yet ranked against the masked store (``evidence/2026-12-04-h200-issue33-d6b8107``:
    the sweep's noise exceeded the difference)."""

    def __post_init__(self) -> None:
        if self.loop not in (0, 1, 2, 3, 4) or (self.loop >= 3 and not self.regs):
            raise ValueError(f"PersistentTiles.loop must be 0-4, and loops 3 and 4 park in registers; got loop "
                             f"{self.loop}, regs {self.regs}")
        if (self.ws or self.flat) and self.loop != 3:
            raise ValueError(f"PersistentTiles.ws and .flat need loop 3, got loop {self.loop}")
        if self.c_split not in (0, 1, 2) or (self.c_split and self.loop != 3):
            raise ValueError(f"PersistentTiles.c_split must be 0, 1 or 2, and a TMA store needs loop 3; got "
                             f"c_split {self.c_split}, loop {self.loop}")
        if self.bk < BK or self.bk % BK or self.bk & (self.bk - 1):
            raise ValueError(f"PersistentTiles.bk must be a power of two multiple of {BK}, got {self.bk}")


PERSISTENT_TILES = PersistentTiles(128, 128, 8, 3, 8, 3, True)
"""The persistent form's configuration, the same for every shape (never derived from M, N or K):
two sibling leaves side by side (``loop = 3``), 3 stages, tiles stored from registers (masked).
Loop structure chosen by
``tools/det_gemm_prefill_sweep.py`` on the H200 (evidence ``2026-12-03-h200-issue33-9f2ce15``: 24
products x 5 configurations at M = 1024 and 4096, every one with the fused form's bits): at M = 4096
it ran 0.64-0.82x cuBLAS where the nest one leaf at a time (``loop = 0``, 4 stages, the earlier
default) ran 0.52-0.78x, every product faster (k/v dx 0.52 -> 0.64, k/v forward and dW 0.70 ->
0.80); 2 stages 0.51-0.59x; all four leaves side by side 0.41-0.48x with 128 x 64 tiles, and
128 x 128 tiles with four accumulators do not compile (registers). The earlier sweep
(``2026-12-03-h200-issue33-72adbef``): the one-loop structure (``loop = 2``) 0.41-0.50x, 128 x 256
tiles 0.11-0.15x, the compiler's flattening (``loop = 1``) does not compile on Triton 3.6, parking
in memory (``regs = False``) 0.61-0.77x."""

PERSISTENT_ON_CUDA = True
"""Whether a GPU of compute capability >= 9.0 runs the persistent TMA form where it applies
(:func:`persistent_applies`); the fused form otherwise. A speed choice: same bits (tested)."""

PERSISTENT_MIN_TILES = 512
"""The persistent form runs for outputs of at least this many ``[bm, bn]`` tiles, or for a longer
reduction (:data:`PERSISTENT_MIN_K_MID`, :data:`PERSISTENT_MIN_K`). With one leaf at a time it
lost to the fused form on three of the four products with 256 tiles and K = 4096 (0.30-0.44x
cuBLAS against 0.54-0.63x) and won on every product with >= 768 tiles or K = 12288; with sibling
leaves side by side (``2026-12-03-h200-issue33-9f2ce15``) it loses at 256 tiles only where K =
1024 (the k/v products' dx and dW at M = 1024: 0.20-0.22x against 0.32-0.33x)."""
PERSISTENT_MIN_K_MID = 4096
"""Reduction length from which the persistent form runs at :data:`PERSISTENT_MIN_TILES_MID_K`
tiles: in that sweep the 256-tile products with K = 4096 ran 0.80x (k/v forward and dW at
M = 4096; the fused form 0.62-0.64x) and 0.63-0.67x (q/o forward and dx at M = 1024; fused
0.63x)."""
PERSISTENT_MIN_TILES_MID_K = 256
PERSISTENT_MIN_K = 8192
"""Reduction length from which the persistent form runs at any tile count of at least
:data:`PERSISTENT_MIN_TILES_LONG_K` (the sweep's 256-tile products with K = 12288: 0.82-0.84x
against 0.73-0.75x)."""
PERSISTENT_MIN_TILES_LONG_K = 128

def persistent_applies(a: torch.Tensor, b: torch.Tensor, depth: int, fp32_merge: bool = False, bk: int = BK) -> bool:
    """Whether the persistent TMA form with K step ``bk`` can compute ``a @ b``: BF16 merges, ``K``
    a multiple of ``bk * 2^depth`` (whole blocks in every leaf) and both operands readable by TMA."""
    k = a.shape[1]
    return (not fp32_merge and 0 <= depth <= TREE_DEPTH and k > 0 and bk % BK == 0 and k % (bk << depth) == 0
            and tma_layout(a) is not None and tma_layout(b) is not None)


def use_persistent(a: torch.Tensor, b: torch.Tensor, depth: int, fp32_merge: bool = False) -> bool:
    """Whether :func:`det_gemm_launch` takes the persistent form: on a GPU of compute capability
    >= 9.0 (TMA), for more rows than a decode step has (``M > 64``; the decode tiles stay) and
    outputs of at least :data:`PERSISTENT_MIN_TILES` tiles (:data:`PERSISTENT_MIN_TILES_MID_K` for
    K >= :data:`PERSISTENT_MIN_K_MID`, :data:`PERSISTENT_MIN_TILES_LONG_K` for K >=
    :data:`PERSISTENT_MIN_K`), where it applies. Depends on the shapes and layouts only;
    every form gives the same bits."""
    if not (PERSISTENT_ON_CUDA and a.device.type == "cuda" and not upcast_dots()):
        return False
    t = PERSISTENT_TILES
    m = a.shape[0]
    tiles = cdiv(m, t.bm) * cdiv(b.shape[1], t.bn)
    k = a.shape[1]
    enough = (tiles >= PERSISTENT_MIN_TILES or (k >= PERSISTENT_MIN_K_MID and tiles >= PERSISTENT_MIN_TILES_MID_K)
              or (k >= PERSISTENT_MIN_K and tiles >= PERSISTENT_MIN_TILES_LONG_K))
    return (m > BATCH_DECODE_TILES.bm and enough and gpu_facts(a.device)[0] >= 9
            and persistent_applies(a, b, depth, fp32_merge, t.bk))


def _tma_operands(a: torch.Tensor, bs: tuple[torch.Tensor, ...], t: PersistentTiles):
    """(A_T, a's descriptor, B_T, the descriptors of ``bs``) of a persistent launch: each operand in
    its stored layout (:func:`tma_layout`; the ``bs`` share one), blocks ``[bm, bk]`` / ``[bk, bn]``
    or their transposes."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    a_t, b_t = tma_layout(a), tma_layout(bs[0])
    a_desc = TensorDescriptor.from_tensor(a.t() if a_t else a, [t.bk, t.bm] if a_t else [t.bm, t.bk])
    b_descs = tuple(TensorDescriptor.from_tensor(b.t() if b_t else b, [t.bn, t.bk] if b_t else [t.bk, t.bn])
                    for b in bs)
    return a_t, a_desc, b_t, b_descs


def _program_count(device: torch.device, tiles: int, programs: int | None) -> int:
    """Programs of a persistent launch over ``tiles`` output tiles: ``programs``, or one per SM (3 under
    the interpreter), never more than the tiles."""
    if programs is None:
        programs = gpu_facts(device)[1] if device.type == "cuda" else 3
    return max(1, min(programs, tiles))


def _persistent_launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, depth: int,
                       tiles: PersistentTiles | None, programs: int | None) -> None:
    t = tiles or PERSISTENT_TILES
    m, k = a.shape
    n = b.shape[1]
    a_t, a_desc, b_t, (b_desc,) = _tma_operands(a, (b,), t)
    parked = depth and not t.regs  # register parking needs no workspace
    w = torch.empty((m, n) if parked else (1, 1), dtype=torch.bfloat16, device=a.device)
    programs = _program_count(a.device, cdiv(m, t.bm) * cdiv(n, t.bn), programs)
    c_desc = None
    if t.c_split and tma_layout(c) is False:  # c row-major with a TMA-aligned pitch
        from triton.tools.tensor_descriptor import TensorDescriptor

        c_desc = TensorDescriptor.from_tensor(c, [t.bm, t.bn // t.c_split])
    _det_gemm_persistent_kernel[(programs,)](
        a_desc, b_desc, c, w, m, n, k, c.stride(0), c.stride(1),
        A_T=a_t, B_T=b_t, DEPTH=depth, BM=t.bm, BN=t.bn, BK=t.bk, GROUP_M=t.group_m, PROGRAMS=programs,
        LOOP=t.loop, REGS=t.regs, UPCAST=upcast_dots(), WS=t.ws, c_desc=c_desc, C_TMA=c_desc is not None,
        C_SPLIT=max(t.c_split, 1), FLAT=t.flat, num_warps=t.num_warps, num_stages=t.num_stages,
        enable_fp_fusion=FP_FUSION,
    )


def det_gemm_swiglu_launch(a: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, depth: int,
                           tiles: PersistentTiles | None = None, programs: int | None = None,
                           fused: bool | None = None) -> torch.Tensor:
    """``y [M, F]`` bf16 = ``swiglu(a @ w_gate, a @ w_up)`` with both products tree-reduced over K
    (``a [M, K]``, ``w_gate`` / ``w_up`` ``[K, F]`` bf16, e.g. the transposed gate / up projection
    weights or two column slices of the packed one; FP32 accumulation per leaf, BF16 merges; swiglu
    in FP32, one rounding): a Qwen3 MLP's gate / up projections and activation in one persistent
    kernel (:func:`_det_gemm_swiglu_kernel`) that writes neither projection.

    ``fused`` None: the fused kernel where :data:`GATE_UP_SWIGLU_ON_CUDA` and
    :func:`persistent_applies` allow it on a CUDA GPU of compute capability >= 9.0, otherwise
    :func:`det_gemm_launch` twice then :func:`rl_engine.ops.swiglu.triton.swiglu_fwd`: the same
    bits (tested); True forces the fused kernel (the interpreter runs it too). ``tiles`` /
    ``programs``: the persistent configuration and grid (None: :data:`PERSISTENT_TILES`, one
    program per SM). Raises ValueError for weights of different shapes or layouts, weights whose
    K is not ``a``'s, or a forced fused kernel that does not apply (K not a multiple of the K step
    * 2^depth, operands TMA cannot read)."""
    from rl_engine.ops.swiglu.triton import swiglu_fwd

    if w_gate.shape != w_up.shape or w_gate.stride() != w_up.stride():
        raise ValueError(f"w_gate and w_up must have one shape and layout, got {tuple(w_gate.shape)} "
                         f"{w_gate.stride()} and {tuple(w_up.shape)} {w_up.stride()}")
    m, k = a.shape
    if w_gate.shape[0] != k:
        raise ValueError(f"a is [M, {k}] but the weights are {tuple(w_gate.shape)}: they must be [K, F]")
    f = w_gate.shape[1]
    t = tiles or PERSISTENT_TILES
    applies = persistent_applies(a, w_gate, depth, False, t.bk) and persistent_applies(a, w_up, depth, False, t.bk)
    if fused is None:
        fused = (GATE_UP_SWIGLU_ON_CUDA and applies and a.device.type == "cuda" and not upcast_dots()
                 and gpu_facts(a.device)[0] >= 9)
    if fused and not applies:
        raise ValueError("the fused gate / up + swiglu kernel needs K a multiple of its K step * 2^depth and "
                         "TMA-readable operands")
    if not fused:
        return swiglu_fwd(det_gemm_launch(a, w_gate, depth), det_gemm_launch(a, w_up, depth))
    y = torch.empty((m, f), dtype=torch.bfloat16, device=a.device)
    if m == 0 or f == 0:
        return y
    a_t, a_desc, b_t, (g_desc, u_desc) = _tma_operands(a, (w_gate, w_up), t)
    programs = _program_count(a.device, cdiv(m, t.bm) * cdiv(f, t.bn), programs)
    _det_gemm_swiglu_kernel[(programs,)](
        a_desc, g_desc, u_desc, y, m, f, k, y.stride(0), y.stride(1),
        A_T=a_t, B_T=b_t, DEPTH=depth, BM=t.bm, BN=t.bn, BK=t.bk, GROUP_M=t.group_m, PROGRAMS=programs,
        UPCAST=upcast_dots(), num_warps=t.num_warps, num_stages=t.num_stages, enable_fp_fusion=FP_FUSION,
    )
    return y


GATE_UP_SWIGLU_ON_CUDA = False
"""Whether :func:`det_gemm_swiglu_launch` takes the fused kernel on a GPU by default. False until
it has run on the H200 (bits against det_gemm then swiglu, and a time below theirs:
``tools/gate_up_swiglu_sweep.py``); the interpreter tests force it."""


LEAF_SPLIT_MAX_M = 1023
"""The leaf-parallel form runs for at most this many rows: at M = 1024 with 64 tiles (Qwen3-8B's k/v
projection) it ran 0.12x cuBLAS on the H200 where the fused form ran 0.25x (the same sweep)."""


def use_leaf_split(m: int, n: int, depth: int, fp32_merge: bool = False) -> bool:
    """Whether :func:`det_gemm_launch` takes the leaf-parallel form for an ``[m, n]`` output."""
    return (depth > 0 and not fp32_merge and m <= LEAF_SPLIT_MAX_M
            and cdiv(m, BM) * cdiv(n, BN) < LEAF_SPLIT_BELOW_TILES)


def det_gemm_launch(a: torch.Tensor, b: torch.Tensor, depth: int, fp32_merge: bool = False,
                    leaf_split: bool | None = None, tiles: LeafTiles | None = None,
                    merge_in_leaves: bool | None = None, counters: torch.Tensor | None = None,
                    persistent: bool | None = None, persistent_tiles: PersistentTiles | None = None,
                    programs: int | None = None) -> torch.Tensor:
    """C [M, N] bf16 = tree-reduced a [M, K] @ b [K, N]; any strides (no copies of a or b).

    ``leaf_split`` forces the form (None: :func:`use_leaf_split`); ``tiles`` the leaf-parallel
    form's tiles (None: :func:`leaf_tiles`); ``merge_in_leaves`` whether the leaf-parallel form
    merges in its last leaf or in a second kernel (None: :data:`MERGE_IN_LEAVES_ON_CUDA` on a GPU), ``counters``
    the in-leaf merge's tile counters (None: :func:`tile_counters`); ``persistent`` forces the
    persistent TMA form on or off (None: :func:`use_persistent`), ``persistent_tiles`` and
    ``programs`` its configuration and grid; tests compare the forms, tiles and merges."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return c
    if persistent is None:
        persistent = leaf_split is None and use_persistent(a, b, depth, fp32_merge)
    if persistent:
        if not persistent_applies(a, b, depth, fp32_merge, (persistent_tiles or PERSISTENT_TILES).bk):
            raise ValueError("the persistent form needs BF16 merges, K a multiple of its K step * 2^depth and "
                             "TMA-readable operands")
        _persistent_launch(a, b, c, depth, persistent_tiles, programs)
        return c
    if leaf_split is None:
        leaf_split = use_leaf_split(m, n, depth, fp32_merge)
    if leaf_split and (depth == 0 or fp32_merge):
        raise ValueError("the leaf-parallel form needs depth >= 1 and BF16 merges")
    bounds = mid_split_bounds(0, k, depth)
    if depth == 2:
        k1, k2, k3 = bounds[1], bounds[2], bounds[3]
    elif depth == 1:
        k1, k2, k3 = 0, bounds[1], 0
    else:
        k1, k2, k3 = 0, 0, 0
    if leaf_split:
        t = tiles or leaf_tiles(m, n)
        w = torch.empty((1 << depth, m, n), dtype=torch.bfloat16, device=a.device)
        tiles_count = cdiv(m, t.bm) * cdiv(n, t.bn)
        if merge_in_leaves is None:
            merge_in_leaves = (a.device.type != "cuda" or MERGE_IN_LEAVES_ON_CUDA) and m <= MERGE_IN_LEAVES_MAX_M
        cnt = (counters if counters is not None else tile_counters(a.device, tiles_count)) if merge_in_leaves else None
        merge = cnt is not None
        _det_gemm_leaves_kernel[(tiles_count, 1 << depth)](
            a, b, w, c, cnt if merge else w, m, n, k, k1, k2, k3, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), BK * a.stride(1), BK * b.stride(0),
            DEPTH=depth, BM=t.bm, BN=t.bn, BK=BK, UPCAST=upcast_dots(), MERGE=merge, num_warps=t.num_warps,
            num_stages=t.num_stages, enable_fp_fusion=FP_FUSION,
        )
        if not merge:
            _det_gemm_merge_kernel[(cdiv(m * n, MERGE_BLOCK),)](
                w, c, m, n, c.stride(0), c.stride(1), DEPTH=depth, BLOCK=MERGE_BLOCK, num_warps=4,
                enable_fp_fusion=FP_FUSION)
        return c
    part_dtype = torch.float32 if fp32_merge else torch.bfloat16
    w = torch.empty((m, n) if depth else (1, 1), dtype=part_dtype, device=a.device)
    s = torch.empty((m, n), dtype=torch.float32, device=a.device) if fp32_merge and depth == 2 else c
    grid = (cdiv(m, BM) * cdiv(n, BN),)
    _det_gemm_kernel[grid](
        a, b, c, w, s, m, n, k, k1, k2, k3,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), s.stride(0), s.stride(1),
        BK * a.stride(1), BK * b.stride(0),
        DEPTH=depth, FP32_MERGE=fp32_merge, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, UPCAST=upcast_dots(),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        enable_fp_fusion=FP_FUSION,
    )
    return c
