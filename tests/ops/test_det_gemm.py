"""det_gemm: accuracy, the declared Option B tree, invariance transforms with negative controls,
the tensor-parallel split, pitfall P6, and input validation."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from _helpers import (bits_equal, check_backward_accuracy, check_forward_accuracy, check_transform, control_caught,
                      int_bits)
from rl_engine.contract import load_contract
from rl_engine.errors import ContractError, InputError
from rl_engine.ops import spec as spec_mod
from rl_engine.ops._triton_common import check_triton_device, mma, upcast_dots
from rl_engine.ops.det_gemm import det_gemm, mid_split_bounds, tp_split_det_gemm
from rl_engine.ops.det_gemm.api import det_gemm_triton, det_gemm_triton_fp32_merge
from rl_engine.ops.det_gemm import triton as dg_triton
from rl_engine.ops.det_gemm.spec import SPEC

SMOKE = spec_mod.WORKLOADS["smoke"]
SEED = 1234
IMPL = SPEC.impls["triton_cuda_bf16"]


def _ints(shape, lo, hi, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, shape, generator=g).to(torch.bfloat16).to(device)


def _cases(device):
    return SPEC.build_cases(SMOKE, SEED, device)


def _grad_case(device):
    return SPEC.build_grad_cases(SMOKE, SEED, device)[0]


# ---------------------------------------------------------------- accuracy
def test_cases_cover_single_row_and_odd_rows(device):
    ms = {c.inputs["a"].shape[0] for c in _cases(device)}
    assert 1 in ms and any(m % 2 == 1 and m > 1 for m in ms)


@pytest.mark.parametrize("idx", range(9), ids=lambda i: f"case{i}")
def test_forward_accuracy(device, contract, idx):
    case = _cases(device)[idx]
    out = check_forward_accuracy(SPEC, case, contract, relative=False).out
    assert out.shape == (case.inputs["a"].shape[0], case.inputs["b"].shape[1])


def test_backward_accuracy(device, contract):
    for case in SPEC.build_grad_cases(SMOKE, SEED, device):
        check_backward_accuracy(SPEC, case, contract, upstream_offset=1)


def test_public_api_and_torch_baseline(device):
    case = _cases(device)[1]
    out = det_gemm(case.inputs["a"], case.inputs["b"])
    assert bits_equal(out, IMPL(**case.inputs))
    base = SPEC.impls["torch_bf16"](**case.inputs)
    assert base.dtype == torch.bfloat16 and base.shape == out.shape


# ---------------------------------------------------------------- declared topology
def test_mid_split_bounds():
    assert mid_split_bounds(0, 97, 2) == [0, 24, 48, 72, 97]
    assert mid_split_bounds(0, 90, 2) == [0, 22, 45, 67, 90]
    assert mid_split_bounds(0, 3, 2) == [0, 0, 1, 2, 3]
    assert mid_split_bounds(48, 97, 1) == [48, 72, 97]
    assert mid_split_bounds(0, 64, 0) == [0, 64]


def _emulate_tree(a: torch.Tensor, b: torch.Tensor, depth: int, bf16_merge: bool) -> torch.Tensor:
    """The contract's tree on inputs whose leaf sums are exact in FP32 (small integers)."""
    bounds = mid_split_bounds(0, a.shape[1], depth)
    leaves = [(a[:, lo:hi].double() @ b[lo:hi].double()).float() for lo, hi in zip(bounds[:-1], bounds[1:])]
    if bf16_merge:
        leaves = [x.to(torch.bfloat16) for x in leaves]
    while len(leaves) > 1:
        merged = [leaves[i].float() + leaves[i + 1].float() for i in range(0, len(leaves), 2)]
        leaves = [x.to(torch.bfloat16) for x in merged] if bf16_merge else merged
    return leaves[0].to(torch.bfloat16)


@pytest.mark.parametrize("k", [97, 90, 64, 3])
def test_tree_topology_exact(device, k):
    """Integer inputs make every FP32 leaf sum exact, so the only roundings are the declared ones:
    the kernel must equal the emulated tree bit for bit, and the FP32-merge control must not."""
    a = _ints((5, k), -16, 16, 10 + k, device)
    b = _ints((k, 20), -16, 16, 20 + k, device)
    out = det_gemm_triton(a, b)
    assert bits_equal(out, _emulate_tree(a, b, 2, True))
    for depth in (0, 1):
        assert bits_equal(det_gemm_triton(a, b, tree_depth=depth), _emulate_tree(a, b, depth, True))
    fp32 = det_gemm_triton_fp32_merge(a, b)
    assert bits_equal(fp32, _emulate_tree(a, b, 2, False))
    if k > 4:
        assert not bits_equal(fp32, out), "integer case too easy: BF16 merges changed nothing"


@pytest.mark.parametrize("leaf_split", [False, True], ids=["fused", "leaf-parallel"])
@pytest.mark.parametrize("depth", [1, 2])
def test_both_forms_compute_the_declared_tree(device, depth, leaf_split):
    """Each form of the Triton kernel, forced, equals the emulated tree on exact integer inputs."""
    a = _ints((5, 97), -16, 16, 3, device)
    b = _ints((97, 20), -16, 16, 4, device)
    out = dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=leaf_split)
    assert bits_equal(out, _emulate_tree(a, b, depth, True))


@pytest.mark.parametrize("m,k,n,transposed", [(1, 300, 200, True), (5, 257, 130, False), (130, 96, 129, True)])
@pytest.mark.parametrize("depth", [1, 2])
def test_leaf_parallel_form_equals_fused_form(device, m, k, n, transposed, depth):
    """The leaf-parallel form (decode-sized M) and the fused form give the same bits on random
    inputs, where leaf roundings matter; the FP32-merge control differs from both, so the
    comparison can fail."""
    g = spec_mod.make_generator(m * 1000 + k)
    a = spec_mod.randn((m, k), g, device=device)
    b = spec_mod.randn((n, k), g, scale=k ** -0.5, device=device).t() if transposed else \
        spec_mod.randn((k, n), g, scale=k ** -0.5, device=device)
    fused = dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=False)
    split = dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=True)
    assert bits_equal(split, fused)
    assert not bits_equal(split, dg_triton.det_gemm_launch(a, b, depth, True, leaf_split=False))


@pytest.mark.parametrize("m,k,n,depth", [(1, 300, 200, 2), (16, 257, 130, 2), (3, 128, 65, 1), (40, 200, 130, 2)])
def test_merge_in_the_last_leaf_equals_the_merge_kernel(device, m, k, n, depth):
    """The leaf-parallel form's in-leaf merge (the program that finishes a tile's last leaf merges
    it) gives the merge kernel's bits, twice in a row (the counters are back at 0 after a launch).
    Control: counters left stale by a launch that did not reset them make the tiles skip their
    merge, and the output is not the product."""
    g = spec_mod.make_generator(m * 977 + k)
    a = spec_mod.randn((m, k), g, device=device)
    b = spec_mod.randn((n, k), g, scale=k ** -0.5, device=device).t()
    separate = dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=True, merge_in_leaves=False)
    merged = [dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=True, merge_in_leaves=True) for _ in range(2)]
    assert bits_equal(merged[0], separate) and bits_equal(merged[1], separate)  # all kept: no freed block holds them
    tiles = dg_triton.leaf_tiles(m, n)
    count = triton.cdiv(m, tiles.bm) * triton.cdiv(n, tiles.bn)
    counters = dg_triton.tile_counters(a.device, count)
    assert counters is not None and int(counters.abs().sum()) == 0
    stale = torch.full((count,), 1 << depth, dtype=torch.int32, device=device)
    skipped = dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=True, merge_in_leaves=True, counters=stale)
    assert not bits_equal(skipped, separate)


@pytest.mark.parametrize("m,k,n", [(1, 300, 200), (16, 257, 130), (3, 128, 65)])
def test_decode_tiles_give_the_prefill_tiles_bits(device, m, k, n):
    """The narrow decode tiles of the leaf-parallel form and its prefill tiles (and the fused form)
    compute every element from the same BK blocks in the same order: same bits on random inputs."""
    g = spec_mod.make_generator(m * 7919 + n)
    a = spec_mod.randn((m, k), g, device=device)
    b = spec_mod.randn((n, k), g, scale=k ** -0.5, device=device).t()
    assert dg_triton.leaf_tiles(m, n) == dg_triton.DECODE_TILES_NARROW != dg_triton.PREFILL_TILES
    assert dg_triton.leaf_tiles(m, 4096) == dg_triton.DECODE_TILES and dg_triton.leaf_tiles(65, n) == dg_triton.PREFILL_TILES
    assert dg_triton.leaf_tiles(17, n) == dg_triton.leaf_tiles(64, 4096) == dg_triton.BATCH_DECODE_TILES
    for tiles in (dg_triton.DECODE_TILES, dg_triton.DECODE_TILES_NARROW, dg_triton.BATCH_DECODE_TILES):
        assert bits_equal(dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=True, tiles=tiles),
                          dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=True, tiles=dg_triton.PREFILL_TILES))
    decode = dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=True, tiles=dg_triton.DECODE_TILES)
    prefill = dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=True, tiles=dg_triton.PREFILL_TILES)
    assert bits_equal(decode, prefill)
    assert bits_equal(decode, dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=False))
    assert not bits_equal(decode, dg_triton.det_gemm_launch(a, b, 1, False, leaf_split=True,
                                                            tiles=dg_triton.DECODE_TILES))  # the tree matters


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the H200's tl.dot, not the interpreter's")
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096), (4096, 6144),
                                 (4096, 24576)], ids=["q_o", "kv", "gate_up", "down", "qkv", "gate_up_fused"])
def test_decode_tiles_equal_the_prefill_path_at_qwen3_8b_shapes(k, n):
    """On the GPU the bits of ``tl.dot`` could depend on the tile shape (the MMA instruction and
    its operand layout change with it): the decode tiles must give the fused prefill form's bits at
    every Qwen3-8B projection shape (and the fused q/k/v and gate/up widths), for M = 1, 5, 16, 17, 64,
    and a row alone must equal the same row inside a 256-row prefill batch."""
    g = torch.Generator(device="cuda").manual_seed(k + n)
    w = (torch.randn((n, k), generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    big = torch.randn((256, k), generator=g, device="cuda").to(torch.bfloat16)
    prefill = dg_triton.det_gemm_launch(big, w.t(), 2, False, leaf_split=False)
    for m in (1, 5, 16, 17, 64):
        out = dg_triton.det_gemm_launch(big[:m], w.t(), 2, False)
        assert dg_triton.use_leaf_split(m, n, 2) and dg_triton.leaf_tiles(m, n) in (
            dg_triton.DECODE_TILES, dg_triton.DECODE_TILES_NARROW, dg_triton.BATCH_DECODE_TILES)
        assert bits_equal(out, prefill[:m]), (m, k, n)


SMALL_PERSISTENT = {(loop, regs, split, flat): dg_triton.PersistentTiles(32, 32, 4, 2, 2, loop, regs, c_split=split,
                                                                          flat=flat)
                    for loop in (0, 1, 2, 3, 4) for regs in (False, True) for split in (0, 1, 2) for flat in (False, True)
                    if (regs or loop < 3) and ((split == 0 and not flat) or loop == 3)}
"""Small tiles for the interpreter, per loop structure, parking, store and loop fusion: several
tiles per program, edges in M and N (loops 3 and 4, sibling leaves side by side, park in registers
only; loop 3 also with the TMA store of whole tiles and of column halves, and fused)."""


def _operand(shape, transposed, g, device, scale=1.0):
    """A BF16 [rows, cols] operand stored row-major, or as the transpose of a row-major [cols, rows]."""
    if transposed:
        return spec_mod.randn(shape[::-1], g, scale=scale, device=device).t()
    return spec_mod.randn(shape, g, scale=scale, device=device)


@pytest.mark.parametrize("m,k,n,a_t,b_t", [(130, 512, 96, False, True), (72, 256, 200, True, False),
                                           (40, 1024, 64, True, True)],
                         ids=["forward", "backward-db", "both-transposed"])
def test_persistent_form_equals_fused_form(device, m, k, n, a_t, b_t):
    """The persistent TMA form (leaves as consecutive items of one pipelined loop) gives the fused
    form's bits at every tree depth, for each operand layout the forward and backward products
    use (a transposed: db = a^T dc; b transposed: the weight ``W.t()``), with M and N edges and
    several tiles per program. Control: a one-level tree differs, so the comparison can fail."""
    g = spec_mod.make_generator(m * 31 + k + n)
    a = _operand((m, k), a_t, g, device)
    b = _operand((k, n), b_t, g, device, scale=k ** -0.5)
    programs = 3 if device.type == "cpu" else None
    default = dg_triton.PERSISTENT_TILES
    tiles = SMALL_PERSISTENT[default.loop, default.regs, default.c_split, default.flat] if device.type == "cpu" else None
    for depth in (0, 1, 2):
        fused = dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=False, persistent=False)
        out = dg_triton.det_gemm_launch(a, b, depth, False, persistent=True, persistent_tiles=tiles, programs=programs)
        assert bits_equal(out, fused), depth
        if device.type == "cpu":  # every loop structure walks the same blocks
            # the stores and the fused loop change no arithmetic: their variants run at depth 2 only
            # (the pending pair carried between items, the last item's store), to keep CI short
            for cfg in (c for c in SMALL_PERSISTENT.values() if depth == 2 or not (c.c_split or c.flat)):
                assert bits_equal(dg_triton.det_gemm_launch(a, b, depth, False, persistent=True, persistent_tiles=cfg,
                                                            programs=programs), fused), (depth, cfg)
    assert not bits_equal(dg_triton.det_gemm_launch(a, b, 1, False, persistent=True, persistent_tiles=tiles,
                                                    programs=programs),
                          dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=False, persistent=False))


def test_persistent_form_with_a_wider_k_step_walks_the_same_leaves(device):
    """A K step of 128 (a sweep option of the persistent form) covers each leaf with half as many
    blocks. On integer-valued operands every product and partial sum is exact in FP32, so any
    summation order gives the same numbers: equality with the fused form checks the blocks, leaf
    bounds, merges and edges, not the rounding order (which the H200 sweep checks bit for bit).
    Leaves of 5 x 64 (K = 4 x 320) are refused at K step 128 (whole blocks only). Control: a
    one-level tree differs (entries up to 20 in size: the leaf sums, exact in FP32 below 2^24, reach
    the thousands, where BF16 rounds them to multiples of 8 or 16, so the leaf roundings show)."""
    g = spec_mod.make_generator(17)
    m, k, n = 70, 1024, 72
    a = torch.randint(-20, 21, (m, k), generator=g).to(torch.bfloat16).to(device)
    b = torch.randint(-20, 21, (n, k), generator=g).to(torch.bfloat16).to(device).t()
    wide = dg_triton.PersistentTiles(32, 32, 4, 2, 2, 0, True, 128)
    programs = 3 if device.type == "cpu" else None
    for depth in (0, 1, 2):
        fused = dg_triton.det_gemm_launch(a, b, depth, False, leaf_split=False, persistent=False)
        out = dg_triton.det_gemm_launch(a, b, depth, False, persistent=True, persistent_tiles=wide, programs=programs)
        assert bits_equal(out, fused), depth
    assert not bits_equal(dg_triton.det_gemm_launch(a, b, 1, False, persistent=True, persistent_tiles=wide,
                                                    programs=programs),
                          dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=False, persistent=False))
    odd = torch.randint(-3, 4, (m, 4 * 320), generator=g).to(torch.bfloat16).to(device)
    w_odd = torch.randint(-3, 4, (4 * 320, n), generator=g).to(torch.bfloat16).to(device)
    assert dg_triton.persistent_applies(odd, w_odd, 2) and not dg_triton.persistent_applies(odd, w_odd, 2, bk=128)
    with pytest.raises(ValueError, match="persistent form"):
        dg_triton.det_gemm_launch(odd, w_odd, 2, False, persistent=True, persistent_tiles=wide)


def test_persistent_form_refuses_what_it_cannot_compute(device):
    """K not a whole number of BK blocks per leaf, a row pitch TMA cannot read, or FP32 merges:
    the persistent form does not apply, and forcing it is an error, not a silent other tree. A
    configuration the kernel has no loop for is refused when it is made."""
    for loop, regs in ((5, True), (3, False), (4, False)):
        with pytest.raises(ValueError, match="loop"):
            dg_triton.PersistentTiles(128, 128, 8, 3, 8, loop, regs)
    for loop in (0, 2, 4):  # the warp-specialised and the fused item loop and the TMA store: loop 3 only
        with pytest.raises(ValueError, match="need loop 3"):
            dg_triton.PersistentTiles(128, 128, 8, 3, 8, loop, True, ws=True)
        with pytest.raises(ValueError, match="need loop 3"):
            dg_triton.PersistentTiles(128, 128, 8, 3, 8, loop, True, flat=True)
        with pytest.raises(ValueError, match="c_split"):
            dg_triton.PersistentTiles(128, 128, 8, 3, 8, loop, True, c_split=2)
    with pytest.raises(ValueError, match="c_split"):
        dg_triton.PersistentTiles(128, 128, 8, 3, 8, 3, True, c_split=4)
    g = spec_mod.make_generator(5)
    b = spec_mod.randn((512, 64), g, device=device)
    assert dg_triton.persistent_applies(spec_mod.randn((8, 512), g, device=device), b, 2)
    assert not dg_triton.persistent_applies(spec_mod.randn((8, 512), g, device=device), b, 2, fp32_merge=True)
    assert not dg_triton.persistent_applies(spec_mod.randn((8, 320), g, device=device),
                                            spec_mod.randn((320, 64), g, device=device), 2)  # 320 = 5 x 64
    odd_pitch = spec_mod.randn((8, 516), g, device=device)[:, :512]  # pitch 1032 bytes: not 16-aligned
    assert not dg_triton.persistent_applies(odd_pitch, b, 2)
    with pytest.raises(ValueError, match="persistent form"):
        dg_triton.det_gemm_launch(odd_pitch, b, 2, False, persistent=True)
    assert not dg_triton.use_persistent(spec_mod.randn((8, 512), g, device=device), b, 2)  # decode-sized M
    if device.type == "cpu":  # no TMA in the interpreter's default path: it stays on the fused form
        assert not dg_triton.use_persistent(spec_mod.randn((4096, 512), g, device=device), b, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the H200's TMA and tl.dot, not the interpreter's")
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096)],
                         ids=["q_o", "kv", "gate_up", "down"])
@pytest.mark.parametrize("m", [1024, 4096])
def test_persistent_form_at_qwen3_8b_training_shapes(m, k, n):
    """At the Qwen3-8B projection shapes of a training step, the default path (the persistent form
    where :func:`use_persistent` picks it) gives the fused form's bits for the forward product
    ``x W^T`` and both backward products (``dx = dy W``, ``dW = dy^T x`` as the backward computes it,
    and ``dW^T = x^T dy``, its transpose)."""
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    w = (torch.randn((n, k), generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    x = torch.randn((m, k), generator=g, device="cuda").to(torch.bfloat16)
    dy = torch.randn((m, n), generator=g, device="cuda").to(torch.bfloat16)
    for name, a, b in (("forward", x, w.t()), ("dx", dy, w), ("dw", dy.t(), x), ("dw^T", x.t(), dy)):
        fused = dg_triton.det_gemm_launch(a, b, 2, False, leaf_split=False, persistent=False)
        assert dg_triton.persistent_applies(a, b, 2), name
        assert bits_equal(dg_triton.det_gemm_launch(a, b, 2, False, persistent=True), fused), (name, m, k, n)
        assert bits_equal(dg_triton.det_gemm_launch(a, b, 2, False), fused), (name, m, k, n)


@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "cuda_bf16"])
def test_weight_gradient_in_the_weights_layout(device, backend):
    """For ``b = W.t()`` the backward computes ``dW = dy^T x`` in W's layout instead of
    ``(x^T dy)^T``: the same exact products over the same blocks, leaves and merges, so the same
    bits (on the GPU this checks that the tensor cores' sum does not depend on which operand is
    which), and W.grad arrives row-major (no transposing copy). Control: a one-level tree differs."""
    if backend == "cuda_bf16" and device.type != "cuda":
        pytest.skip("cuda_bf16 needs the GPU")
    g = spec_mod.make_generator(77)
    m, k, n = (300, 256, 192) if device.type == "cpu" else (4096, 4096, 4096)  # GPU: the persistent form
    x = spec_mod.randn((m, k), g, device=device)
    w = spec_mod.randn((n, k), g, scale=k ** -0.5, device=device).requires_grad_(True)
    dy = spec_mod.randn((m, n), g, device=device)
    det_gemm(x, w.t(), backend=backend).backward(dy)
    assert w.grad.is_contiguous() and w.grad.shape == (n, k)
    from rl_engine.ops._torch_op import launchers
    launch = launchers("det_gemm", backend).det_gemm_launch
    assert bits_equal(w.grad, launch(x.t(), dy, 2, False).t())
    assert not bits_equal(w.grad, launch(x.t(), dy, 1, False).t())


def test_leaf_parallel_form_is_chosen_by_output_shape_only():
    assert dg_triton.use_leaf_split(1, 4096, 2) and dg_triton.use_leaf_split(257, 4096, 2)
    assert not dg_triton.use_leaf_split(4096, 4096, 2) and not dg_triton.use_leaf_split(1024, 1024, 2)
    assert not dg_triton.use_leaf_split(1, 4096, 0) and not dg_triton.use_leaf_split(1, 4096, 2, fp32_merge=True)


def test_contract_depth_asserted(monkeypatch, device):
    assert dg_triton.TREE_DEPTH == load_contract().det_gemm["tree_depth"]
    a = _ints((2, 8), -2, 2, 1, device)
    b = _ints((8, 3), -2, 2, 2, device)
    monkeypatch.setattr(dg_triton, "TREE_DEPTH", 3)
    with pytest.raises(ContractError, match="tree_depth"):
        det_gemm_triton(a, b)


# ---------------------------------------------------------------- tensor-parallel split
@pytest.mark.parametrize("k", [96, 97, 90, 7], ids=lambda k: f"K{k}")
def test_tp_split_bitwise(device, k):
    g = spec_mod.make_generator(k)
    a = spec_mod.randn((11, k), g, device=device)
    b = spec_mod.randn((k, 40), g, scale=k ** -0.5, device=device)
    full = IMPL(a=a, b=b)
    for parts in (2, 4):
        assert bits_equal(tp_split_det_gemm(a, b, parts, IMPL), full), f"K={k} split in {parts}"
    assert not bits_equal(tp_split_det_gemm(a, b, 4, det_gemm_triton_fp32_merge),
                          det_gemm_triton_fp32_merge(a, b))


def test_tp_split_rejects_unsupported_parts(device):
    a = _ints((2, 8), -2, 2, 1, device)
    b = _ints((8, 3), -2, 2, 2, device)
    with pytest.raises(InputError, match="supported splits"):
        tp_split_det_gemm(a, b, 3, IMPL)


# ---------------------------------------------------------------- invariance
def test_row0_independent_of_m(device):
    g = spec_mod.make_generator(7)
    a = spec_mod.randn((33, SMOKE.ffn), g, device=device)
    b = spec_mod.randn((SMOKE.ffn, SMOKE.hidden), g, scale=SMOKE.ffn ** -0.5, device=device)
    assert bits_equal(IMPL(a=a[:1], b=b)[0], IMPL(a=a, b=b)[0])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout", "tp"])
def test_transform_bitwise_and_planted_control(device, name, direction):
    check_transform(SPEC, name, _grad_case(device), direction)


@pytest.mark.parametrize("name", ["batch", "tp"])
def test_known_breaking_controls_caught(device, name):
    control = SPEC.controls[name]
    pairs = SPEC.transforms[name](control, _grad_case(device), "forward", False)
    assert control_caught(pairs), f"{control.__name__} not caught by {name}"


def test_layout_accepts_transposed_weight(device):
    g = spec_mod.make_generator(3)
    a = spec_mod.randn((9, SMOKE.hidden), g, device=device)
    w = spec_mod.randn((SMOKE.ffn, SMOKE.hidden), g, scale=SMOKE.hidden ** -0.5, device=device)
    assert bits_equal(IMPL(a=a, b=w.t()), IMPL(a=a, b=w.t().contiguous()))
    assert bits_equal(IMPL(a=a.t().contiguous().t(), b=w.t()), IMPL(a=a, b=w.t().contiguous()))


# ---------------------------------------------------------------- pitfall P6
@triton.jit
def _p6_kernel(a_ptr, b_ptr, c_ptr, UPCAST: tl.constexpr):
    r = tl.arange(0, 16)
    offs = r[:, None] * 16 + r[None, :]
    a = tl.load(a_ptr + offs)
    b = tl.load(b_ptr + offs)
    c = mma(a, b, tl.zeros((16, 16), dtype=tl.float32), UPCAST)
    tl.store(c_ptr + offs, c)


@pytest.mark.parametrize("upcast", [True, False], ids=["UPCAST", "backend-default"])
def test_p6_fp32_dot_is_ieee(device, upcast):
    """P6: K = 16, a = 1 + 2^-12, b = 1 in FP32 -> exactly 16.00390625 (TF32 would give 16.0)."""
    a = torch.full((16, 16), 1.0 + 2.0 ** -12, dtype=torch.float32, device=device)
    b = torch.ones((16, 16), dtype=torch.float32, device=device)
    c = torch.empty((16, 16), dtype=torch.float32, device=device)
    check_triton_device(a, b, c)
    _p6_kernel[(1,)](a, b, c, UPCAST=upcast or upcast_dots())
    assert torch.equal(c, torch.full_like(c, 16.0 + 2.0 ** -8))
    assert torch.equal(torch.full((1,), 16.0 + 2.0 ** -8).view(torch.int32), torch.full((1,), 16.00390625).view(torch.int32))


# ---------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_input_error(device):
    a = torch.zeros((4, 8), dtype=torch.bfloat16, device=device)
    b = torch.zeros((8, 3), dtype=torch.bfloat16, device=device)
    with pytest.raises(InputError, match="dtype"):
        IMPL(a=a.float(), b=b)
    with pytest.raises(InputError, match="dtype"):
        IMPL(a=a, b=b.half())
    with pytest.raises(InputError, match="dimensions"):
        IMPL(a=a[0], b=b)
    with pytest.raises(InputError, match="dimensions"):
        IMPL(a=a, b=b.unsqueeze(0))
    with pytest.raises(InputError, match="K differs"):
        IMPL(a=a, b=torch.zeros((7, 3), dtype=torch.bfloat16, device=device))
    with pytest.raises(InputError, match="device"):
        IMPL(a=a, b=torch.zeros((8, 3), dtype=torch.bfloat16, device="meta"))
    with pytest.raises(InputError, match="tree_depth"):
        det_gemm_triton(a, b, tree_depth=3)
    with pytest.raises(InputError, match="Tensor"):
        IMPL(a=[[1.0]], b=b)


def test_empty_shapes(device):
    a = torch.zeros((0, 8), dtype=torch.bfloat16, device=device)
    b = torch.ones((8, 3), dtype=torch.bfloat16, device=device)
    assert IMPL(a=a, b=b).shape == (0, 3)
    out = IMPL(a=torch.ones((2, 0), dtype=torch.bfloat16, device=device), b=torch.ones((0, 3), dtype=torch.bfloat16, device=device))
    assert torch.equal(int_bits(out), torch.zeros((2, 3), dtype=torch.int16, device=device))


@pytest.mark.parametrize("m,k,f", [(70, 256, 200), (130, 512, 64)], ids=["edges", "rows"])
def test_gate_up_swiglu_kernel_equals_det_gemm_then_swiglu(device, m, k, f):
    """The fused gate / up projection + SwiGLU kernel (``det_gemm_swiglu_launch``) gives the bits of
    det_gemm then the swiglu op at every tree depth, for the two weights as transposes of
    ``[F, K]`` tensors (the chain's projections) and as column slices of the packed ``[2F, K]``
    weight, with M and F edges and several tiles per program. Controls: the gate and up weights
    exchanged, and a one-level tree, each give other bits; on this machine's defaults it runs the
    unfused form (``GATE_UP_SWIGLU_ON_CUDA`` is off until the H200 has run it)."""
    from rl_engine.ops.swiglu.triton import swiglu_fwd

    g = spec_mod.make_generator(m * 17 + k + f)
    a = spec_mod.randn((m, k), g, device=device)
    gate_up = spec_mod.randn((2 * f, k), g, scale=k ** -0.5, device=device)
    w_gate, w_up = gate_up[:f].clone().t(), gate_up[f:].clone().t()
    programs = 3 if device.type == "cpu" else None
    tiles = SMALL_PERSISTENT[3, True, 0, False] if device.type == "cpu" else None
    for depth in (0, 1, 2):
        want = swiglu_fwd(dg_triton.det_gemm_launch(a, w_gate, depth, False, leaf_split=False, persistent=False),
                          dg_triton.det_gemm_launch(a, w_up, depth, False, leaf_split=False, persistent=False))
        got = dg_triton.det_gemm_swiglu_launch(a, w_gate, w_up, depth, tiles, programs, fused=True)
        assert bits_equal(got, want), depth
        packed = gate_up.t()
        assert bits_equal(dg_triton.det_gemm_swiglu_launch(a, packed[:, :f], packed[:, f:], depth, tiles, programs,
                                                           fused=True), want), depth
        assert bits_equal(dg_triton.det_gemm_swiglu_launch(a, w_gate, w_up, depth), want), depth
    # row-major [K, F] weights (the descriptor holds them as stored, no transposed block)
    assert bits_equal(dg_triton.det_gemm_swiglu_launch(a, w_gate.contiguous(), w_up.contiguous(), 2, tiles, programs,
                                                       fused=True), want)
    assert not bits_equal(dg_triton.det_gemm_swiglu_launch(a, w_up, w_gate, 2, tiles, programs, fused=True), want)
    assert not bits_equal(dg_triton.det_gemm_swiglu_launch(a, w_gate, w_up, 1, tiles, programs, fused=True), want)


def test_gate_up_swiglu_kernel_refuses_what_it_cannot_compute(device):
    """Weights of different shapes, weights whose K is not the activations', and a forced fused
    kernel on a K that does not split into whole blocks per leaf are refused before any launch."""
    a = torch.zeros((4, 96), dtype=torch.bfloat16, device=device)
    w = torch.zeros((96, 8), dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="one shape and layout"):
        dg_triton.det_gemm_swiglu_launch(a, w, w[:, :4], 2)
    with pytest.raises(ValueError, match="must be \\[K, F\\]"):
        dg_triton.det_gemm_swiglu_launch(a, w[:64], w[:64], 2)
    with pytest.raises(ValueError, match="K step"):
        dg_triton.det_gemm_swiglu_launch(a, w, w, 2, fused=True)
