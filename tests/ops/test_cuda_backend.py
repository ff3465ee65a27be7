"""The cuda_bf16 backend (CUDA C++ kernels) against the FP32 references, the contract's invariance
transforms, and the properties its kernels promise.

Every test runs in two modes:

* ``gpu`` (marked ``gpu``): the real ``sm_90a`` library on CUDA tensors (H100 / H200);
* ``emulated``: the same ``.cu`` sources compiled for the host by ``tests/cuda_emu`` and run on
  CPU tensors (one OS thread per CUDA thread; WMMA emulated with an FP32 FMA chain per tile).
  This exercises the kernels' indexing, masks, strides, reduction orders, the K tree and the
  Python-to-C argument lists on machines without a GPU; it cannot show tensor-core rounding,
  timing or device-compiler issues (those need the ``gpu`` mode). Skipped where a GPU is present.

Accuracy goes through the gate's own judgments (contract tolerances, the relative criterion
against ``torch_bf16``, gradient rel-peak / RMS ratio); invariance uses the op specs' transforms
with a planted one-ulp negative control. No tolerance literal appears here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
from pathlib import Path

import pytest
import torch

from rl_engine import env
from rl_engine.backends.cuda_build import BuildResult, CudaLibrary
from rl_engine.backends.cuda_launch import host_emulation
from rl_engine.contract import load_contract
from rl_engine.errors import BackendUnavailable, InputError
from rl_engine.gate.compare import compare_bitwise
from rl_engine.gate.judgments import GREEN, forward_accuracy, gradient_accuracy, prepare_forward, prepare_gradient
from rl_engine.ops import spec as spec_mod
from rl_engine.ops.registry import get_spec

from rl_engine.ops.attention.api import attention_cuda, attention_decode_cuda
from rl_engine.ops.batch_invariant_logp.api import batch_invariant_logp_cuda
from rl_engine.ops.det_gemm.api import det_gemm_cuda
from rl_engine.ops.embedding.api import embedding_cuda
from rl_engine.ops.linear_logp.api import linear_logp_cuda
from rl_engine.ops.lm_head.api import lm_head_cuda
from rl_engine.ops.lm_head.cuda import gemm_f32_out
from rl_engine.ops.logp.api import logp_cuda
from rl_engine.ops.pack.api import pack_cuda, unpack_cuda
from rl_engine.ops.qk_norm.api import qk_norm_cuda
from rl_engine.ops.rms_norm.api import rms_norm_cuda
from rl_engine.ops.rope.api import rope_cuda
from rl_engine.ops.silu.api import silu_cuda
from rl_engine.ops.swiglu.api import swiglu_cuda

SMOKE = spec_mod.WORKLOADS["smoke"]
SEED = 0
"""The gate's default seed: forward cases use it, gradient cases ``SEED + 500`` (gate/runner.py)."""
GRAD_SEED = SEED + 500

CUDA_IMPLS = {
    "embedding": embedding_cuda,
    "rope": rope_cuda,
    "silu": silu_cuda,
    "swiglu": swiglu_cuda,
    "pack": pack_cuda,
    "rms_norm": rms_norm_cuda,
    "qk_norm": qk_norm_cuda,
    "lm_head": lm_head_cuda,
    "det_gemm": det_gemm_cuda,
    "attention": attention_cuda,
    "logp": logp_cuda,
    "linear_logp": linear_logp_cuda,
    "batch_invariant_logp": batch_invariant_logp_cuda,
}
OPS = sorted(CUDA_IMPLS)
TRANSFORMS = ("batch", "chunk", "padding", "layout", "tp")


# ------------------------------------------------------------------------------------------ modes
def _emulated_library() -> CudaLibrary:
    import sys

    tests_dir = str(Path(__file__).resolve().parents[1])
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from cuda_emu.build import build

    path = build(env.cache_dir() / "cuda_emu")
    return CudaLibrary(BuildResult(path, "host-emulation", True, 0.0))


@pytest.fixture(scope="module", params=[pytest.param("gpu", marks=pytest.mark.gpu), "emulated"])
def cuda_mode(request):
    """``(device, emulated library or None)`` of this mode; skips with the reason when unavailable."""
    if request.param == "gpu":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip(f"cuda_bf16 is built for sm_90a; this GPU is {torch.cuda.get_device_capability()}")
        if shutil.which("nvcc") is None:
            pytest.skip("nvcc is not on PATH: the CUDA library cannot be built")
        return torch.device("cuda"), None
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the real kernels run in the gpu mode (the emulation is for GPU-less CI)")
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH: the host emulation of the CUDA sources cannot be built")
    try:
        return torch.device("cpu"), _emulated_library()
    except FileNotFoundError as exc:
        pytest.skip(f"host emulation unavailable: {exc}")


@pytest.fixture
def cuda_device(cuda_mode):
    """The device the cuda_bf16 impls run on (inside the host emulation for the ``emulated`` mode,
    for the duration of one test only)."""
    device, lib = cuda_mode
    if lib is None:
        yield device
        return
    with host_emulation(lib):
        yield device


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return compare_bitwise("cuda_bf16", a, b, load_contract().nan_policy).passed


def _bf16(shape, seed, device, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tuple(shape), generator=g) * scale).to(torch.bfloat16).to(device)


# --------------------------------------------------------------------------------------- accuracy
RELATIVE_EXEMPT = {"det_gemm"}
"""Ops whose relative-criterion result is reported, not asserted: det_gemm's declared Option B
tree (BF16 leaves and merges, contract declared_exceptions.det_gemm) is up to ~2 BF16 ulp off the
FP32 product by design, while torch_bf16 rounds once; the Triton kernel shows the same ratio. The
absolute contract tolerance is still asserted. Whether the gate should exempt the declared
exception from the relative criterion is the project's decision."""


def _assert_judgments_green(op: str, impl, workload, device, label: str) -> None:
    """The gate's judgments for ``impl`` of ``op`` on ``workload``'s cases: forward and gradient
    accuracy green against the FP32 reference, and each invariance transform, forward and gradient,
    bitwise equal with its planted one-ulp control caught. ``label`` names the implementation in
    failures."""
    spec = get_spec(op)
    contract = load_contract()
    prepared = [prepare_forward(spec, c) for c in spec.build_cases(workload, SEED, device)]
    _assert_green(op, "forward", *forward_accuracy(spec, impl, prepared, contract))
    grads = [prepare_gradient(spec, c) for c in spec.build_grad_cases(workload, GRAD_SEED, device)]
    _assert_green(op, "gradient", *gradient_accuracy(spec, impl, grads, contract))
    for direction in ("forward", "gradient"):
        case = (spec.build_grad_cases(workload, GRAD_SEED, device)[0] if direction == "gradient"
                else spec.build_cases(workload, SEED, device)[-1])
        for name in TRANSFORMS:
            fn = spec.transforms.get(name)
            if not callable(fn):
                continue
            pairs = fn(impl, case, direction, False)
            assert pairs, f"{op}.{name}: no comparisons"
            bad = [q.label for q in pairs if not _bits_equal(q.canonical, q.transformed)]
            assert not bad, f"{label} {op} {direction} {name}: not bitwise equal: {bad[:5]}"
            planted = fn(impl, case, direction, True)
            assert any(not _bits_equal(q.canonical, q.transformed) for q in planted), \
                f"{label} {op} {direction} {name}: the planted control was not caught"


def _assert_green(op: str, direction: str, status: str, reason: str, details: dict) -> None:
    if status == GREEN:
        return
    if op in RELATIVE_EXEMPT:
        hard = []
        for rep in details["reports"]:
            for key in ("accuracy", "grad_norm", "integer_output"):
                if key in rep and not rep[key].get("passed", True):
                    hard.append(f"{rep['case']}: {key}")
        assert not hard, f"{op} {direction}: {hard}; {reason}"
        return
    raise AssertionError(f"{op} {direction}: {reason}")

@pytest.mark.parametrize("op", OPS)
def test_forward_accuracy(cuda_device, op):
    spec = get_spec(op)
    contract = load_contract()
    prepared = [prepare_forward(spec, c) for c in spec.build_cases(SMOKE, SEED, cuda_device)]
    assert prepared, f"{op}: no smoke cases"
    status, reason, details = forward_accuracy(spec, CUDA_IMPLS[op], prepared, contract)
    _assert_green(op, "forward", status, reason, details)


@pytest.mark.parametrize("op", OPS)
def test_gradient_accuracy(cuda_device, op):
    spec = get_spec(op)
    if not spec.grad_inputs or spec.build_grad_cases is None:
        pytest.skip(f"{op} takes no gradient: {spec.no_grad_reason}")
    contract = load_contract()
    prepared = [prepare_gradient(spec, c) for c in spec.build_grad_cases(SMOKE, GRAD_SEED, cuda_device)]
    status, reason, details = gradient_accuracy(spec, CUDA_IMPLS[op], prepared, contract)
    _assert_green(op, "gradient", status, reason, details)


# -------------------------------------------------------------------------------------- invariance
def _invariance_params():
    out = []
    for op in OPS:
        spec = get_spec(op)
        for name in TRANSFORMS:
            if callable(spec.transforms.get(name)):
                out.append(pytest.param(op, name, id=f"{op}-{name}"))
    return out


@pytest.mark.parametrize(("op", "transform"), _invariance_params())
@pytest.mark.parametrize("direction", ["forward", "gradient"])
def test_invariance_bitwise_with_negative_control(cuda_device, op, transform, direction):
    spec = get_spec(op)
    if direction == "gradient":
        if not spec.grad_inputs or spec.build_grad_cases is None:
            pytest.skip(f"{op} takes no gradient")
        case = spec.build_grad_cases(SMOKE, GRAD_SEED, cuda_device)[0]
    else:
        case = spec.build_cases(SMOKE, SEED, cuda_device)[-1]
    fn = spec.transforms[transform]
    impl = CUDA_IMPLS[op]
    pairs = fn(impl, case, direction, False)
    assert pairs, f"{op}.{transform} produced no comparisons"
    bad = [p.label for p in pairs if not _bits_equal(p.canonical, p.transformed)]
    assert not bad, f"{op}.{transform} ({direction}) not bitwise equal: {bad[:5]}"
    planted = fn(impl, case, direction, True)
    assert any(not _bits_equal(p.canonical, p.transformed) for p in planted), "planted one-ulp change not caught"


@pytest.mark.parametrize("op", OPS)
def test_deterministic_run_to_run(cuda_device, op):
    spec = get_spec(op)
    case = spec.build_cases(SMOKE, SEED, cuda_device)[-1]
    impl = CUDA_IMPLS[op]
    with torch.no_grad():
        a = impl(**case.inputs)
        b = impl(**case.inputs)
    assert _bits_equal(a, b)


# ---------------------------------------------------------------------------------------- det_gemm
def test_det_gemm_tree_equals_explicit_leaves_and_bf16_merges(cuda_device):
    """The kernel's Option B tree equals four FP32-accumulated K slices (the FP32-output GEMM on
    the mid-split leaves) rounded to BF16 and merged ((l0 + l1) + (l2 + l3)) in BF16, bit for bit;
    depth 0 equals one FP32 GEMM rounded once."""
    from rl_engine.ops.det_gemm.api import merge_bf16, mid_split_bounds

    a = _bf16((37, 101), 1, cuda_device)
    b = _bf16((101, 131), 2, cuda_device, scale=101 ** -0.5)
    bounds = mid_split_bounds(0, 101, 2)
    leaves = [gemm_f32_out(a[:, lo:hi], b[lo:hi]).to(torch.bfloat16) for lo, hi in zip(bounds[:-1], bounds[1:])]
    expected = merge_bf16(merge_bf16(leaves[0], leaves[1]), merge_bf16(leaves[2], leaves[3]))
    assert _bits_equal(det_gemm_cuda(a, b), expected)
    assert _bits_equal(det_gemm_cuda(a, b, tree_depth=0), gemm_f32_out(a, b).to(torch.bfloat16))


@pytest.mark.parametrize("m,k,n,transposed", [(1, 300, 200, True), (37, 101, 131, False), (130, 96, 129, True)])
def test_det_gemm_leaf_parallel_form_equals_fused_form(cuda_device, m, k, n, transposed):
    """rl_det_gemm_leaves (decode-sized outputs) and rl_det_gemm give the same bits at depth 1 and
    2; a different tree depth differs from both, so the comparison can fail."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    a = _bf16((m, k), m + k, cuda_device)
    b = _bf16((n, k), n, cuda_device, scale=k ** -0.5).t() if transposed else \
        _bf16((k, n), n, cuda_device, scale=k ** -0.5)
    for depth in (1, 2):
        fused = dg_cuda.det_gemm_launch(a, b, depth, leaf_split=False)
        split = dg_cuda.det_gemm_launch(a, b, depth, leaf_split=True)
        assert _bits_equal(split, fused), f"depth {depth}"
    assert not _bits_equal(dg_cuda.det_gemm_launch(a, b, 2, leaf_split=True), dg_cuda.det_gemm_launch(a, b, 1, leaf_split=False))
    assert dg_cuda.use_leaf_split(1, 4096, 2) and not dg_cuda.use_leaf_split(4096, 4096, 2)


@contextlib.contextmanager
def _library_setting(setter, value):
    """``setter(value)`` (a process-wide library setting that returns the previous value) inside the
    block, the previous value restored after it."""
    old = setter(value)
    try:
        yield
    finally:
        assert setter(old) == value


def _tree_gemm_form(form: int):
    """Training-size GEMMs in ``form`` (det_gemm.cuda.TREE_GEMM_FORMS) inside the block."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    return _library_setting(dg_cuda.set_tree_gemm_form, form)


def _pipe_layouts(device, m, k, n):
    """``{name: (a [m, k], b [k, n])}`` in the layouts training multiplies: the forward's ``x @ w^T``
    (both K-contiguous), ``dy @ w`` (b N-contiguous), ``x^T @ dy`` (both M- / N-contiguous) and the
    remaining mix; the M- / N-contiguous ones are column slices of wider tensors, so a row of 16-byte
    copies ends in a part-filled copy at M or N. Every depth-2 leaf holds a cancelling pair of 2^24
    products (k = lo + 3 and lo + 20, one in each MMA of the first step): the terms between them are
    absorbed, so a change in which products meet in which order changes the BF16 results too."""
    from rl_engine.ops.det_gemm.api import mid_split_bounds

    x = _bf16((m, k), m + k, device)
    w = _bf16((n, k), n, device, scale=k ** -0.5)
    xt = _bf16((k, (m // 8 + 1) * 8), k, device)  # rows a multiple of 8 elements long
    wt = _bf16((k, (n // 8 + 1) * 8), k + 1, device, scale=k ** -0.5)
    for lo in mid_split_bounds(0, k, 2)[:-1]:
        for kk, big in ((lo + 3, 2.0 ** 24), (lo + 20, -(2.0 ** 24))):
            x[:, kk] = big
            xt[kk, :] = big
            w[:, kk] = 1.0
            wt[kk, :] = 1.0
    xt, wt = xt[:, :m], wt[:, :n]
    return {"k-k": (x, w.t()), "k-n": (x, wt), "m-n": (xt.t(), wt), "m-k": (xt.t(), w.t())}


_FORM0_PRODUCTS: dict = {}


def _form0_products(device, m, k, n):
    """Form 0's (the WMMA kernels') products of :func:`_pipe_layouts` per ``(layout, depth)``: the
    whole tree and the leaf-parallel form (depth 2), and per ``(layout, "f32")`` the FP32 output;
    computed once per device and shape for all the forms compared against them (the emulated WMMA
    kernels are the slowest part of those cases)."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    key = (str(device), m, k, n)
    if key not in _FORM0_PRODUCTS:
        refs = {}
        with _tree_gemm_form(0):
            for name, (a, b) in _pipe_layouts(device, m, k, n).items():
                for depth in (0, 2):
                    refs[name, depth] = (dg_cuda.det_gemm_launch(a, b, depth, leaf_split=False),
                                         dg_cuda.det_gemm_launch(a, b, depth, leaf_split=True) if depth else None)
                refs[name, "f32"] = gemm_f32_out(a, b)
        _FORM0_PRODUCTS[key] = refs
    return _FORM0_PRODUCTS[key]


@pytest.mark.parametrize("form", [1, 2, 3, 4, 5, 6, 7, 8])  # (a separate case each: a form that faults on the GPU
@pytest.mark.parametrize("m,k,n", [(130, 256, 136), (66, 1056, 75), (1024, 4096, 4096)])  # cannot hide another)
def test_det_gemm_pipelined_form_equals_wmma_form(cuda_device, m, k, n, form):
    """Forms 1 to 4 of the training-size GEMMs give the WMMA kernels' (form 0) bits for each operand
    layout at tree depths 0 and 2 (depth 1's merge is depth 2's first), at partial tiles along M and
    N, part-filled 16-byte copies at M / N and leaves that end inside a 32-wide step (1056: leaves of
    264; 75 and 66 columns): form 1 (tree_pipe_kernel: cp.async ring, ldmatrix / ldmatrix.trans,
    mma.sync, 128 x 128 tiles, held leaf sums in registers; also the leaf-parallel form, the FP32
    output, and a misaligned view falling back to form 0), form 2 (128 x 256 tiles, held sums in
    shared memory), form 3 (tree_wgmma_kernel: wgmma for the training step's three layouts, form 1
    for the remaining m-k; also the leaf-parallel form and the FP32 output; in the emulation through a decoder of the ISA's
    canonical descriptor layouts, which cannot show whether the hardware reads them so), form 4 (form 3's
    products on the warp-specialised tree_wgmma_ws_kernel: a copy warpgroup and two MMA warpgroups
    handing ring places over through shared-memory barriers, persistent and one block per tile; the
    emulation runs the barrier protocol between the fibers, so a place handed back too early is
    overwritten before it is read, and has 2 SMs, so a persistent block runs several tiles). The test
    first checks that the pipelined kernel can run each case (tree_pipe_ok). Control: a depth-1 tree
    in the same form differs from the depth-2 one. Form 5 (form 4 with TMA copies: in the emulation
    the boxes land with zero fill outside each leaf's map and the barriers count their bytes) and form
    6 (form 5's fused trees in 128 x 256 tiles) and form 7 (form 5 with the depth-2 trees' sibling
    leaves side by side, two accumulators; 1056: leaves of 5 slots, the last one a single part-filled
    32-wide step) and form 8 (the depth-2 trees' leaves rolled: each rounded after the next one's
    first slot, a tile's last leaf and store after the next tile's; the persistent emulation's blocks
    run several tiles, so a tile's store under its successor's MMAs is covered) must also
    have run their own kernels (the launch count rises), not form 4's or 5's in their place."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    own_before = dg_cuda.form_launches(form) if form >= 5 else None

    if cuda_device.type == "cpu" and m * k * n > 130 * 256 * 136 * 2:
        pytest.skip("the Qwen3-8B-sized case runs on the GPU only (the host emulation runs one fiber per CUDA thread)")
    refs = _form0_products(cuda_device, m, k, n)
    for name, (a, b) in _pipe_layouts(cuda_device, m, k, n).items():
        for depth in (0, 2):  # (depth 1's merge is depth 2's first one)
            assert dg_cuda.tree_pipe_ok(a, b, depth), f"{name} depth {depth}: the pipelined kernel cannot run it"
            wmma, wmma_leaves = refs[name, depth]
            if form == 2:
                wmma_leaves = None
            with _tree_gemm_form(form):
                pipe = dg_cuda.det_gemm_launch(a, b, depth, leaf_split=False)
                assert _bits_equal(pipe, wmma), f"{name} depth {depth} form {form}"
                if form >= 4:  # one block per tile as well as the persistent grid (the emulation: 2 SMs)
                    with _library_setting(dg_cuda.set_tree_wgmma_ws_persistent, 0):
                        assert _bits_equal(dg_cuda.det_gemm_launch(a, b, depth, leaf_split=False), wmma), \
                            f"{name} depth {depth} form {form}, a block per tile"
                if wmma_leaves is not None:  # (form 2 runs the leaf-parallel leaves as form 1 does)
                    assert _bits_equal(dg_cuda.det_gemm_launch(a, b, depth, leaf_split=True), wmma_leaves), \
                        f"{name} depth {depth} leaf-parallel"
        if form != 2:  # (form 2 runs the FP32 output as form 1 does)
            f32 = refs[name, "f32"]
            with _tree_gemm_form(form):
                assert torch.equal(gemm_f32_out(a, b).view(torch.int32), f32.view(torch.int32)), \
                    f"{name} FP32 output form {form}"
        with _tree_gemm_form(form):
            one = dg_cuda.det_gemm_launch(a, b, 1, leaf_split=False)
            assert not _bits_equal(one, pipe), f"{name}: depth 1 and 2 agree, the comparison cannot fail"
    if own_before is not None:
        assert dg_cuda.form_launches(form) > own_before, f"form {form} never ran its own kernel"
    if form == 1:  # A K-contiguous operand 2 bytes off a 16-byte boundary: form 1 cannot run it, form 0 does.
        x, wt = _pipe_layouts(cuda_device, m, k, n)["k-k"]
        wide = torch.zeros((m, k + 8), dtype=torch.bfloat16, device=cuda_device)
        wide[:, 1:k + 1] = x
        assert not dg_cuda.tree_pipe_ok(wide[:, 1:k + 1], wt, 2)
        with _tree_gemm_form(1):
            assert _bits_equal(dg_cuda.det_gemm_launch(wide[:, 1:k + 1], wt, 2, leaf_split=False),
                               dg_cuda.det_gemm_launch(x, wt, 2, leaf_split=False))


@pytest.mark.parametrize("m,k,f", [(130, 256, 136), (66, 1056, 75)])
def test_det_gemm_swiglu_is_det_gemm_then_swiglu(cuda_device, m, k, f):
    """The one-launch gate / up projections + SwiGLU (``rl_det_gemm_swiglu``: the depth-2 fused tree of
    each half of the packed weight, the gate tile's result parked while the up tile runs, SwiGLU in
    the store) gives the bits of det_gemm into [M, 2F] then swiglu on its halves: partial tiles along
    M and F, leaves that end inside a slot (1056: leaves of 264), an odd F (single-element stores).
    It must have run its own kernel (the launch count rises). Control: the packed weight with its
    halves swapped gives other bits (SwiGLU is not symmetric). Refused before any launch: odd
    columns, a K that is not a's, a forced fused call at depth 1 or in form 4."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda
    from rl_engine.ops.swiglu.cuda import swiglu_fwd

    if cuda_device.type == "cpu" and m * k * f > 130 * 256 * 136 * 2:
        pytest.skip("the host emulation runs one fiber per CUDA thread")
    g = torch.Generator().manual_seed(m + k + f)
    x = (torch.randn(m, k, generator=g) * 0.5).to(torch.bfloat16).to(cuda_device)
    w = (torch.randn(2 * f, k, generator=g) * 0.1).to(torch.bfloat16).to(cuda_device)  # [gate; up], packed
    gu = dg_cuda.det_gemm_launch(x, w.t(), 2, leaf_split=False)
    want = swiglu_fwd(gu[:, :f], gu[:, f:])
    assert dg_cuda.det_gemm_swiglu_ok(x, w.t(), 2), "the one-launch kernel cannot run this case"
    before = dg_cuda.swiglu_launches()
    got = dg_cuda.det_gemm_swiglu_launch(x, w.t(), 2, fused=True)
    assert dg_cuda.swiglu_launches() > before, "rl_det_gemm_swiglu never ran"
    assert _bits_equal(got, want)
    assert _bits_equal(dg_cuda.det_gemm_swiglu_launch(x, w.t(), 2, fused=False), want)
    swapped = torch.cat([w[f:], w[:f]])
    assert not _bits_equal(dg_cuda.det_gemm_swiglu_launch(x, swapped.t(), 2, fused=True), got)
    with pytest.raises(ValueError, match="2F"):
        dg_cuda.det_gemm_swiglu_launch(x, w[1:].t(), 2)
    with pytest.raises(ValueError, match="2F"):
        dg_cuda.det_gemm_swiglu_launch(x[:, 8:], w.t(), 2)
    with pytest.raises(ValueError, match="cannot run"):
        dg_cuda.det_gemm_swiglu_launch(x, w.t(), 1, fused=True)
    with _tree_gemm_form(4), pytest.raises(ValueError, match="cannot run"):
        dg_cuda.det_gemm_swiglu_launch(x, w.t(), 2, fused=True)


def test_tree_gemm_form_is_checked(cuda_device):
    """Forms outside TREE_GEMM_FORMS are refused before anything runs."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    for bad in (-1, 2, True):
        with pytest.raises(InputError, match="persistent grid"):
            dg_cuda.set_tree_wgmma_ws_persistent(bad)
    for bad in (-1, dg_cuda.TREE_GEMM_FORMS, True, 1.0):
        with pytest.raises(InputError, match="tree gemm form"):
            dg_cuda.set_tree_gemm_form(bad)
    for bad in (4, 9, True):  # only forms 5 to 8 have kernels of their own to count
        with pytest.raises(InputError, match="form_launches"):
            dg_cuda.form_launches(bad)
    assert all(dg_cuda.form_launches(f) >= 0 for f in (5, 6, 7, 8))


@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096), (1056, 72)])
def test_det_gemm_decode_form_equals_fused_form(cuda_device, k, n):
    """At decode-sized M (<= 64) with a contiguous weight, the leaf-parallel form runs a streamed
    decode kernel (the warp GEMV with ``warp_gemv`` below TILE_GEMV_MIN_M, else the ring,
    gemv_leaf_kernel; from TILE_GEMV_MIN_M the warpgroup form on the GPU, the tile form
    gemv_tile_kernel in the emulation); its bits equal the fused
    128 x 128 kernel's at every Qwen3-8B projection shape and at a K whose leaves end inside a 32-wide
    step (1056: leaves of 264), and so do every tile geometry's on the GPU, and the tile form where
    ``set_tile_gemv_min_m(1)`` puts it in place of the warp GEMV. Control: a depth-1 tree differs."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    if cuda_device.type == "cpu" and n * k > 1056 * 72:
        pytest.skip("Qwen3-8B shapes run on the GPU only (the host emulation runs one fiber per CUDA thread)")
    w = _bf16((n, k), n + k, cuda_device, scale=k ** -0.5)
    for m in (1, 5, 16, 17, 33, 64):
        a = _bf16((m, k), m, cuda_device)
        fused = dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=False)
        for warp in (False, True):
            assert _bits_equal(dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=True, warp_gemv=warp), fused), \
                f"M={m} warp_gemv={warp}"
        if cuda_device.type == "cuda":  # the tile form's geometries at the real shapes
            try:
                for v in dg_cuda.TILE_GEMV_VARIANTS + dg_cuda.WGMMA_GEMV_VARIANTS:
                    dg_cuda.set_gemv_variant(v)
                    assert _bits_equal(dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=True, warp_gemv=False),
                                       fused), f"M={m} variant {v}"
            finally:
                dg_cuda.set_gemv_variant(0)
            old = dg_cuda.set_tile_gemv_min_m(1)  # the tile form in place of the warp GEMV too
            try:
                assert _bits_equal(dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=True, warp_gemv=True), fused), \
                    f"M={m} tile from M = 1"
            finally:
                assert dg_cuda.set_tile_gemv_min_m(old) == 1
    assert not _bits_equal(dg_cuda.det_gemm_launch(a, w.t(), 1, leaf_split=True), fused)


@contextlib.contextmanager
def _warp_gemv_up_to_16():
    """The warp GEMV for every M <= 16 (by default the warpgroup form takes M >= TILE_GEMV_MIN_M)."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    old = dg_cuda.set_tile_gemv_min_m(17)
    try:
        yield
    finally:
        dg_cuda.set_tile_gemv_min_m(old)


def test_det_gemm_warp_gemv_depth_one_and_row_blocks(cuda_device):
    """The warp-streamed decode GEMV (``warp_gemv=True``, below the warpgroup form's rows, here up to
    M = 16: one or two 8-row blocks of A, the leaves merged in the block) gives the 128 x 128
    kernel's bits at tree depth 1 and 2 and at every M from 1 to 16 (on the GPU; five of them in the
    emulation), with N not a multiple of the block's columns, and the FP32 logits of the other
    kernels; control: the other depth differs."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    gpu = cuda_device.type == "cuda"
    k, n = (4096, 1000) if gpu else (2112, 24)  # emulation: leaves of 528 (depth 2) and 1056 (depth 1)
    w = _bf16((n, k), 5, cuda_device, scale=k ** -0.5)
    rows = _bf16((16, k), 6, cuda_device)
    # the 128 x 128 kernel is batch-invariant (tested above), so its 16 rows serve every M
    fused = {d: dg_cuda.det_gemm_launch(rows, w.t(), d, leaf_split=False) for d in (1, 2)}
    logits = gemm_f32_out(rows, w.t(), warp_gemv=False).view(torch.int32)
    with _warp_gemv_up_to_16():
        _check_warp_gemv_rows(dg_cuda, w, rows, fused, logits, range(1, 17) if gpu else (1, 3, 8, 9, 16))


def _check_warp_gemv_rows(dg_cuda, w, rows, fused, logits, ms) -> None:
    for m in ms:  # the emulation: both row blocks and their edges
        a = rows[:m]
        for depth in (1, 2):
            warp = dg_cuda.det_gemm_launch(a, w.t(), depth, leaf_split=True, warp_gemv=True)
            assert _bits_equal(warp, fused[depth][:m]), f"M={m} depth {depth}"
        assert not _bits_equal(dg_cuda.det_gemm_launch(a, w.t(), 1, leaf_split=True, warp_gemv=True), fused[2][:m])
        assert torch.equal(gemm_f32_out(a, w.t(), warp_gemv=True).view(torch.int32), logits[:m]), f"logits M={m}"


def test_every_warp_gemv_geometry_gives_the_same_bits(cuda_device):
    """Each geometry of the warp GEMV (``set_warp_gemv_variant``: columns per warp, ring slots) gives
    the fused kernel's bits for the BF16 leaves (one and two 8-row blocks of A) and the ring GEMV's
    FP32 logits. Control: a depth-1 tree differs. The default geometry is restored."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    # emulation: leaves of 840 = 26 32-wide steps and a quarter, seven 128-wide slots (every ring wraps)
    k, n = (4096, 1000) if cuda_device.type == "cuda" else (3360, 24)
    w = _bf16((n, k), 8, cuda_device, scale=k ** -0.5)
    rows = _bf16((16, k), 9, cuda_device)
    refs = {m: (dg_cuda.det_gemm_launch(rows[:m], w.t(), 2, leaf_split=False),
                gemm_f32_out(rows[:m], w.t(), warp_gemv=False).view(torch.int32)) for m in (3, 12)}
    try:
        old_min_m = dg_cuda.set_tile_gemv_min_m(17)  # the warp GEMV at M = 12 too
        for v in range(dg_cuda.WARP_GEMV_VARIANTS):
            dg_cuda.set_warp_gemv_variant(v)
            for m, (fused, logits) in refs.items():
                a = rows[:m]
                warp = dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=True, warp_gemv=True)
                assert _bits_equal(warp, fused), f"variant {v}, M={m}"
                assert torch.equal(gemm_f32_out(a, w.t(), warp_gemv=True).view(torch.int32), logits), f"variant {v}, M={m}"
        assert not _bits_equal(dg_cuda.det_gemm_launch(rows[:3], w.t(), 1, leaf_split=True, warp_gemv=True), refs[3][0])
    finally:
        dg_cuda.set_warp_gemv_variant(0)
        dg_cuda.set_tile_gemv_min_m(old_min_m)
    with pytest.raises(InputError, match="warp gemv variant"):
        dg_cuda.set_warp_gemv_variant(dg_cuda.WARP_GEMV_VARIANTS)


def test_every_gemv_ring_variant_gives_the_same_bits(cuda_device):
    """Each geometry of the decode GEMV (``set_gemv_variant``; the warpgroup forms on the GPU only)
    gives the fused kernel's bits for the BF16 leaves at tree depth 2 and 1 and the FP32 logits,
    with leaves that end inside a 32-wide step (K = 1056: leaves of 264) and N = 72 (a partial
    64-column tile). Control: a depth-1 tree differs from depth 2. The default variant is restored."""
    from rl_engine.ops.det_gemm import cuda as dg_cuda
    from rl_engine.ops.lm_head.cuda import gemm_f32_out

    w = _bf16((72, 1056), 3, cuda_device, scale=1056 ** -0.5)
    rows = _bf16((70, 1056), 4, cuda_device)
    logits = gemm_f32_out(rows, w.t())  # 70 rows: the 128 x 128 kernel
    try:
        for v in range(dg_cuda.GEMV_VARIANTS):
            if cuda_device.type == "cpu" and v in dg_cuda.WGMMA_GEMV_VARIANTS:
                continue  # no warpgroup MMA in the host emulation
            dg_cuda.set_gemv_variant(v)
            for m in (5, 20, 40) + ((64,) if cuda_device.type == "cuda" else ()):  # one, two and three 16-row fragments per warp
                a = rows[:m]
                fused = dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=False)
                ring = dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=True, warp_gemv=False)
                assert _bits_equal(ring, fused), f"variant {v}, M={m}"
                assert torch.equal(gemm_f32_out(a, w.t(), warp_gemv=False).view(torch.int32),
                                   logits[:m].view(torch.int32)), \
                    f"variant {v}, M={m}"
                depth1 = dg_cuda.det_gemm_launch(a, w.t(), 1, leaf_split=True, warp_gemv=False)
                assert _bits_equal(depth1, dg_cuda.det_gemm_launch(a, w.t(), 1, leaf_split=False)), \
                    f"variant {v}, M={m}, depth 1"
                assert not _bits_equal(depth1, fused)
    finally:
        dg_cuda.set_gemv_variant(0)
    with pytest.raises(InputError, match="gemv variant"):
        dg_cuda.set_gemv_variant(dg_cuda.GEMV_VARIANTS)
    assert dg_cuda.set_tile_gemv_min_m(1) == dg_cuda.TILE_GEMV_MIN_M  # the tile form at M = 5, not the warp GEMV
    try:
        a = rows[:5]
        assert _bits_equal(dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=True, warp_gemv=True),
                           dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=False))
    finally:
        dg_cuda.set_tile_gemv_min_m(dg_cuda.TILE_GEMV_MIN_M)
    for bad in (0, 66, True, 2.0):
        with pytest.raises(InputError, match="tile gemv min m"):
            dg_cuda.set_tile_gemv_min_m(bad)


@pytest.mark.parametrize("order", ["hf", "fused"])
def test_add_rms_norm_cuda_is_the_add_then_the_norm(cuda_device, order):
    """The decode step's fused residual add + RMSNorm (``rl_add_rms_norm_fwd``) is bitwise
    ``(x + d, rms_norm(x + d))`` of the separate CUDA launches, at rows held in 8, 32 and 64
    registers per thread. Control: a change of one unit in the last place of one element of the
    sum is seen."""
    from rl_engine.chain.fused import add_rms_norm_cuda

    for t, e in ((1, 4096), (3, 1000), (2, 8192), (5, 200)):
        x = _bf16((t, e), t + e, cuda_device)
        d = _bf16((t, e), t * e, cuda_device)
        w = _bf16((e,), e, cuda_device)
        s, y = add_rms_norm_cuda(x, d, w, 1e-6, order)
        ref_s = x + d
        assert _bits_equal(s, ref_s), f"T={t} E={e}"
        assert _bits_equal(y, rms_norm_cuda(ref_s, w, 1e-6, order)), f"T={t} E={e}"
        nudged = ref_s.clone()
        nudged.view(torch.int16)[t // 2, e // 3] += 1
        assert not _bits_equal(y, rms_norm_cuda(nudged, w, 1e-6, order))
    with pytest.raises(InputError, match="above the kernel"):
        z = torch.zeros((1, 8200), dtype=torch.bfloat16, device=cuda_device)
        add_rms_norm_cuda(z, z, z[0], 1e-6, order)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_qk_norm_rope_cuda_is_the_norms_the_rotations_and_the_cache_write(cuda_device, d):
    """One CUDA launch gives the separate CUDA launches' ``rope(qk_norm(q))``, ``rope(qk_norm(k))``
    and indexed cache stores (q/k/v as column views of one packed product). Control: the rotation
    run backwards (sin negated) is seen."""
    from rl_engine.chain.fused import qk_norm_rope_cuda

    t, h, hkv, b, s_max = 3, 4, 2, 2, 6
    qkv = _bf16((t, (h + 2 * hkv) * d), d, cuda_device)
    q = qkv[:, : h * d].reshape(t, h, d)
    k = qkv[:, h * d : (h + hkv) * d].reshape(t, hkv, d)
    v = qkv[:, (h + hkv) * d :].reshape(t, hkv, d)
    qw = _bf16((d,), 1, cuda_device)
    kw = _bf16((d,), 2, cuda_device)
    ang = torch.rand((t, d // 2), generator=torch.Generator().manual_seed(3)).to(cuda_device) * 6.0
    cos, sin = torch.cos(ang), torch.sin(ang)
    rows = torch.tensor([0, 1, 1], dtype=torch.int64, device=cuda_device)
    pos = torch.tensor([2, 0, 5], dtype=torch.int64, device=cuda_device)

    def caches():
        return [torch.full((b, s_max, hkv, d), float("nan"), dtype=torch.bfloat16, device=cuda_device) for _ in range(2)]

    for order in ("hf", "fused"):
        kc, vc = caches()
        q_out, k_out = qk_norm_rope_cuda(q, k, v, qw, kw, 1e-6, order, cos, sin, k_cache=kc, v_cache=vc, rows=rows,
                                         positions=pos)
        ref_q = rope_cuda(qk_norm_cuda(q, qw, 1e-6, order), cos, sin)
        ref_k = rope_cuda(qk_norm_cuda(k, kw, 1e-6, order), cos, sin)
        rk, rv = caches()
        rk[rows, pos] = ref_k
        rv[rows, pos] = v
        assert _bits_equal(q_out, ref_q) and _bits_equal(k_out, ref_k), order
        assert _bits_equal(kc, rk) and _bits_equal(vc, rv), order
        no_cache = qk_norm_rope_cuda(q, k, v, qw, kw, 1e-6, order, cos, sin)
        assert _bits_equal(no_cache[0], ref_q) and _bits_equal(no_cache[1], ref_k)
        back = qk_norm_rope_cuda(q, k, v, qw, kw, 1e-6, order, cos, -sin)
        assert not _bits_equal(back[0], ref_q) and not _bits_equal(back[1], ref_k)
    if d == 256:  # the kernel's largest head dim; one step above is refused before any launch
        big = torch.zeros((1, 1, 512), dtype=torch.bfloat16, device=cuda_device)
        tab = torch.zeros((1, 256), dtype=torch.float32, device=cuda_device)
        with pytest.raises(InputError, match="above the kernel"):
            qk_norm_rope_cuda(big, big, big, big[0, 0], big[0, 0], 1e-6, "hf", tab, tab)


def test_lm_head_decode_rows_equal_prefill_rows(cuda_device):
    """The FP32-output GEMM (lm_head logits) takes the streamed decode kernel for M <= 64 and the
    128 x 128 kernel above; a row's FP32 logits are the same bits either way (batch invariance
    across the two kernels). Control: a different hidden row differs."""
    from rl_engine.ops.lm_head.cuda import gemm_f32_out

    v, e = (3000, 4096) if cuda_device.type == "cuda" else (130, 256)
    w = _bf16((v, e), 7, cuda_device, scale=e ** -0.5)
    h = _bf16((70, e), 8, cuda_device)
    big = gemm_f32_out(h, w.t())  # 70 rows: the 128 x 128 kernel
    for rows in ((0,), (3, 4, 5), tuple(range(16)), tuple(range(20, 53)), tuple(range(64))):
        small = gemm_f32_out(h[list(rows)], w.t())
        assert torch.equal(small.view(torch.int32), big[list(rows)].view(torch.int32)), f"rows {rows}"
    assert not torch.equal(gemm_f32_out(h[1:2], w.t()).view(torch.int32), big[:1].view(torch.int32))


def test_det_gemm_any_strides_and_unaligned_views(cuda_device):
    a = _bf16((29, 75), 3, cuda_device)
    b = _bf16((75, 40), 4, cuda_device, scale=75 ** -0.5)
    canonical = det_gemm_cuda(a, b)
    wide = torch.full((29, 83), float("nan"), dtype=torch.bfloat16, device=cuda_device)
    wide[:, 3:78] = a
    assert _bits_equal(det_gemm_cuda(wide[:, 3:78], b), canonical)  # 2-byte aligned rows
    assert _bits_equal(det_gemm_cuda(a.t().contiguous().t(), b.t().contiguous().t()), canonical)
    for r in (0, 13, 28):
        assert _bits_equal(det_gemm_cuda(a[r:r + 1], b), canonical[r:r + 1])


def test_det_gemm_empty_and_zero_k(cuda_device):
    a = torch.zeros((0, 8), dtype=torch.bfloat16, device=cuda_device)
    b = _bf16((8, 5), 5, cuda_device)
    assert det_gemm_cuda(a, b).shape == (0, 5)
    z = det_gemm_cuda(torch.zeros((3, 0), dtype=torch.bfloat16, device=cuda_device),
                      torch.zeros((0, 4), dtype=torch.bfloat16, device=cuda_device))
    assert z.shape == (3, 4) and bool((z == 0).all())


# --------------------------------------------------------------------------------------- attention
def _varlen(lens, h, hkv, d, seed, device):
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    t = int(cu[-1])
    return _bf16((t, h, d), seed, device), _bf16((t, hkv, d), seed + 1, device), _bf16((t, hkv, d), seed + 2, device), cu


@pytest.mark.parametrize("d,h,hkv", [(32, 4, 2), (64, 4, 2), (32, 10, 2)])
def test_attention_decode_bitwise_equals_prefill_rows(cuda_device, d, h, hkv):
    """Every probed decode position (block edges, zero-length rows, NaN junk past each length) in
    both decode forms (two launches, one pass) and the public op is bitwise the prefill row, for
    query groups of 2 (half a block's heads) and 5 (a second head block with one head)."""
    from rl_engine.ops.attention import cuda as at_cuda

    lens = [1, 70, 5, 130]
    q, k, v, cu = _varlen(lens, h, hkv, d, 7, cuda_device)
    scale = d ** -0.5
    with torch.no_grad(), _attention_fwd_form("fma"):  # the CUDA-core forms (the declared form: below)
        full = attention_cuda(q, k, v, cu, cu, scale)
        s_max = max(lens) + 9
        kc = torch.full((len(lens), s_max, hkv, d), float("nan"), dtype=torch.bfloat16, device=cuda_device)
        vc = torch.full_like(kc, float("nan"))
        # Every position of every sequence as a decode step (cache holds keys 0 .. pos, NaN junk after).
        for step in range(max(lens)):
            rows, live = [], []
            for b, n in enumerate(lens):
                if step < n:
                    start = int(cu[b])
                    kc[b, : step + 1] = k[start : start + step + 1]
                    vc[b, : step + 1] = v[start : start + step + 1]
                    rows.append(start + step)
                    live.append(b)
            if step not in (0, 1, 63, 64, 65, 69, 129):
                continue
            seqlens = torch.tensor([min(step + 1, n) if step < n else 0 for n in lens], dtype=torch.int32,
                                   device=cuda_device)
            qd = torch.zeros((len(lens), h, d), dtype=torch.bfloat16, device=cuda_device)
            for b, r in zip(live, rows):
                qd[b] = q[r]
            for form in ("two_launch", "one_pass"):
                out = at_cuda.attention_decode_fwd(qd, kc, vc, seqlens, scale, form=form)
                for b, r in zip(live, rows):
                    assert _bits_equal(out[b], full[r]), (step, b, form)
                for b in set(range(len(lens))) - set(live):
                    assert bool((out[b] == 0).all()) and not bool(torch.signbit(out[b]).any()), form
            assert _bits_equal(attention_decode_cuda(qd, kc, vc, seqlens, scale), out)


def test_attention_decode_head_dim_split_keeps_the_bits(cuda_device):
    """The decode kernel's head-dim split (blocks that each own D / d_split output columns and load
    only that slice of V) gives the unsplit bits for d_split 2, 4, 8 at D = 128, with NaN written
    past every length (masked means absent); d_split 0 (the library's choice), the one-pass form
    with either ring depth and the library's form too. Control: a cache whose V columns are rotated differs, in both forms."""
    with _attention_fwd_form("fma"):  # the CUDA-core decode forms (the declared form has one)
        _decode_head_dim_split_keeps_the_bits(cuda_device)


def _decode_head_dim_split_keeps_the_bits(cuda_device):
    """The CUDA-core decode of the fma forward form (see the test above)."""
    from rl_engine.ops.attention import cuda as at_cuda

    lens, h, hkv, d = (1, 63, 130), 8, 2, 128
    kc = _bf16((len(lens), max(lens) + 5, hkv, d), 21, cuda_device)
    vc = _bf16((len(lens), max(lens) + 5, hkv, d), 22, cuda_device)
    for i, n in enumerate(lens):
        kc[i, n:] = float("nan")
        vc[i, n:] = float("nan")
    q = _bf16((len(lens), h, d), 23, cuda_device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=cuda_device)
    whole = at_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5, d_split=1, form="two_launch")
    for split in (2, 4, 8, 0):
        got = at_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5, d_split=split, form="two_launch")
        assert _bits_equal(got, whole), split
    for form in ("one_pass", "auto"):
        assert _bits_equal(at_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5, form=form), whole), form
    try:
        for stages in at_cuda.ONE_PASS_STAGES:  # the one-pass form's shallow and deep rings
            at_cuda.set_one_pass_stages(stages)
            got = at_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5, form="one_pass")
            assert _bits_equal(got, whole), stages
    finally:
        assert at_cuda.set_one_pass_stages(0) == at_cuda.ONE_PASS_STAGES[-1]
    for bad in (1, 4, True):
        with pytest.raises(InputError, match="one-pass stages"):
            at_cuda.set_one_pass_stages(bad)
    assert at_cuda.set_decode_form("one_pass") == "auto"  # the process-wide form of form="auto" calls
    try:
        assert _bits_equal(at_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5), whole)
    finally:
        assert at_cuda.set_decode_form("auto") == "one_pass"
    with pytest.raises(InputError, match="decode form"):
        at_cuda.set_decode_form("fused")
    # which calls need the FP32 score scratch (only the two launches write it): the launcher's rule
    from rl_engine.backends.cuda_launch import query

    uses = [query("rl_attention_decode_uses_scores", *a) for a in
            ((3, 8, 2, 0), (16, 32, 8, 0), (16, 32, 8, 1), (3, 8, 2, 2), (3, 8, 3, 0), (3, 8, 2, 3))]
    assert uses == [1, 0, 1, 0, -1, -1], uses
    at_cuda.set_decode_form("one_pass")
    try:
        assert query("rl_attention_decode_uses_scores", 3, 8, 2, 0) == 0
    finally:
        at_cuda.set_decode_form("auto")
    with pytest.raises(InputError, match="form must be one of"):
        at_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5, form="fused")
    with pytest.raises(InputError, match="two_launch form only"):
        at_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5, d_split=2, form="one_pass")
    rolled = vc[:, :, :, list(range(1, d)) + [0]].contiguous()
    assert not _bits_equal(at_cuda.attention_decode_fwd(q, kc, rolled, seqlens, d ** -0.5, d_split=4,
                                                        form="two_launch"), whole)
    assert not _bits_equal(at_cuda.attention_decode_fwd(q, kc, rolled, seqlens, d ** -0.5, form="one_pass"), whole)


def test_attention_decode_equals_prefill_at_qwen3_8b_shapes(cuda_device):
    """At Qwen3-8B head shapes (32 query heads, 8 KV heads, D = 128) and contexts up to 2050, a
    decode step's output is bitwise the prefill row of the same query at every probed position
    (block edges included): in the fma forward form for every column split of the second launch and
    the one-pass form, in the declared form for its walk and its split step. One BF16 output is
    too coarse to show a one-ulp FP32 change of the softmax sum in a few hundred elements, so this
    runs on the GPU with 2^20 outputs per probe set. Control: the keys of another sequence differ."""
    from rl_engine.ops.attention import cuda as at_cuda

    if cuda_device.type == "cpu":
        pytest.skip("Qwen3-8B shapes run on the GPU only (the host emulation runs one fiber per CUDA thread)")
    lens, h, hkv, d = [1, 700, 1100, 2050], 32, 8, 128
    q, k, v, cu = _varlen(lens, h, hkv, d, 31, cuda_device)
    fma_forms = [("two_launch", s) for s in (0, 1, 2, 4, 8)] + [("one_pass", 0), ("auto", 0)]
    for fwd_form, decode_forms in (("fma", fma_forms), ("declared", ["walk", "split", "auto"])):
        with _attention_fwd_form(fwd_form):
            _decode_equals_prefill_at_qwen3_8b_shapes(q, k, v, cu, lens, h, hkv, d, decode_forms, cuda_device)


def _decode_equals_prefill_at_qwen3_8b_shapes(q, k, v, cu, lens, h, hkv, d, decode_forms, cuda_device):
    """The probes and the control of the test above in the process's attention forward form;
    ``decode_forms``: (form, d_split) pairs of the fma form's decode, or names of
    attention.cuda.DECLARED_DECODE_FORMS."""
    from rl_engine.ops.attention import cuda as at_cuda

    scale = d ** -0.5
    with torch.no_grad():
        full = attention_cuda(q, k, v, cu, cu, scale)
        kc = torch.zeros((len(lens), max(lens), hkv, d), dtype=torch.bfloat16, device=cuda_device)
        vc = torch.zeros_like(kc)
        for b, n in enumerate(lens):
            kc[b, :n] = k[int(cu[b]):int(cu[b]) + n]
            vc[b, :n] = v[int(cu[b]):int(cu[b]) + n]
        probes = sorted(set(range(0, max(lens), 37)) | {63, 64, 65, 699, 1023, 1024, 1099, 2047, 2048, 2049})
        for pos in probes:
            live = [b for b, n in enumerate(lens) if pos < n]
            seqlens = torch.tensor([pos + 1 if pos < n else 0 for n in lens], dtype=torch.int32, device=cuda_device)
            qd = torch.zeros((len(lens), h, d), dtype=torch.bfloat16, device=cuda_device)
            for b in live:
                qd[b] = q[int(cu[b]) + pos]
            want = full[torch.tensor([int(cu[b]) + pos for b in live], device=cuda_device)]
            for form in decode_forms:
                if isinstance(form, tuple):  # the fma form's decode forms
                    out = at_cuda.attention_decode_fwd(qd, kc, vc, seqlens, scale, d_split=form[1], form=form[0])
                else:
                    with _library_setting(at_cuda.set_declared_decode_form, form):
                        out = at_cuda.attention_decode_fwd(qd, kc, vc, seqlens, scale)
                assert _bits_equal(out[live], want), (pos, form)
        seqlens = torch.tensor([1, 700, 700, 700], dtype=torch.int32, device=cuda_device)
        qd = q[torch.tensor([0, int(cu[1]) + 699, int(cu[2]) + 699, int(cu[3]) + 699], device=cuda_device)]
        out = at_cuda.attention_decode_fwd(qd, kc[[0, 2, 1, 3]], vc, seqlens, scale)
        assert not _bits_equal(out[1], full[int(cu[1]) + 699])


def test_attention_decode_past_4096_keys(cuda_device):
    """Decode rows at lengths 4096, 4097 and 4300 (64, 65 and 68 key blocks), with keys that grow
    along the sequence so the running maximum keeps moving late in the walk, are bitwise the
    prefill row of the same query (the last query of each sequence, as a chunk of one row over all
    its keys), in both decode forms. Control: the same query with the keys past 4096 negated differs."""
    from rl_engine.ops.attention import cuda as at_cuda

    lens, h, hkv, d = (4096, 4097, 4300), 4, 1, 16
    scale = d ** -0.5
    s_max = max(lens)
    ramp = torch.linspace(0.5, 3.0, s_max)[:, None, None].to(cuda_device)
    kc = (_bf16((len(lens), s_max, hkv, d), 41, cuda_device).float() * ramp).to(torch.bfloat16)
    vc = _bf16((len(lens), s_max, hkv, d), 42, cuda_device)
    q = _bf16((len(lens), h, d), 43, cuda_device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=cuda_device)
    with torch.no_grad():
        out = attention_decode_cuda(q, kc, vc, seqlens, scale)
        for form in ("two_launch", "one_pass"):
            assert _bits_equal(at_cuda.attention_decode_fwd(q, kc, vc, seqlens, scale, form=form), out), form
        for b, n in enumerate(lens):
            cq = torch.tensor([0, 1], dtype=torch.int32, device=cuda_device)
            ck = torch.tensor([0, n], dtype=torch.int32, device=cuda_device)
            row = attention_cuda(q[b:b + 1], kc[b, :n].contiguous(), vc[b, :n].contiguous(), cq, ck, scale)
            assert _bits_equal(out[b], row[0]), n
        flipped = kc.clone()
        flipped[2, 4096:] = -flipped[2, 4096:]
        assert not _bits_equal(attention_decode_cuda(q, flipped, vc, seqlens, scale)[2], out[2])


def test_attention_score_chains_keep_their_order(cuda_device):
    """The prefill's scores are FMA chains over d in increasing order, as the decode step's: on a query
    and key whose products are 2^24, 0, 3, -1, ..., -2^24 the running FP32 sum rounds differently
    in another order (2^24 + 3 rounds to 2^24 + 4, then - 1 stays there; - 1 first gives 2^24 + 2),
    and the scores move the softmax, so a prefill that changed the order (e.g. the register tile of
    dot_block adding a pair's two products the other way round) would differ from the decode row."""
    d = 32
    q = torch.zeros((3, 2, d), dtype=torch.float32)
    k = torch.randn((3, 1, d), generator=torch.Generator().manual_seed(4)) * 0.1
    v = torch.randn((3, 1, d), generator=torch.Generator().manual_seed(5))
    q[:, :, 0], q[:, :, 2], q[:, :, 3], q[:, :, 30] = 2.0 ** 12, 3.0, -1.0, -(2.0 ** 12)
    k[:, :, 0], k[:, :, 30] = 0.0, 0.0  # the other keys' scores stay small
    k[0, :, :] = 0.0
    k[0, :, 0], k[0, :, 2], k[0, :, 3], k[0, :, 30] = 2.0 ** 12, 1.0, 1.0, 2.0 ** 12
    q, k, v = (t.to(torch.bfloat16).to(cuda_device) for t in (q, k, v))
    cu = torch.tensor([0, 3], dtype=torch.int32, device=cuda_device)
    scale = d ** -0.5
    with torch.no_grad():
        full = attention_cuda(q, k, v, cu, cu, scale)
        lens = torch.tensor([3], dtype=torch.int32, device=cuda_device)
        step = attention_decode_cuda(q[2:3], k.unsqueeze(0), v.unsqueeze(0), lens, scale)
    assert _bits_equal(step, full[2:3])
    # Control: the same row with the score of key 0 two ulps (at 2^24) lower differs.
    k2 = k.clone()
    k2[0, :, 3] = 2.0  # products 3, -2: 2^24 + 4 - 2 = 2^24 + 2, another score
    with torch.no_grad():
        assert not _bits_equal(attention_cuda(q, k2, v, cu, cu, scale)[2:3], full[2:3])


def test_attention_chunked_prefill_bitwise(cuda_device):
    lens = [150]
    q, k, v, cu = _varlen(lens, 4, 1, 32, 11, cuda_device)
    with torch.no_grad():
        full = attention_cuda(q, k, v, cu, cu, 0.2)
        for lo, hi in ((0, 1), (1, 64), (64, 65), (65, 150), (100, 150)):
            cq = torch.tensor([0, hi - lo], dtype=torch.int32, device=cuda_device)
            ck = torch.tensor([0, hi], dtype=torch.int32, device=cuda_device)
            part = attention_cuda(q[lo:hi], k[:hi], v[:hi], cq, ck, 0.2)
            assert _bits_equal(part, full[lo:hi]), (lo, hi)


def _attention_bwd_form(form: str):
    """The cuda_bf16 attention backward in ``form`` (attention.cuda.BWD_FORMS) inside the block."""
    from rl_engine.ops.attention import cuda as attn_cuda

    return _library_setting(attn_cuda.set_bwd_form, form)


def test_attention_tensor_core_backward(cuda_device):
    """The backward's tensor-core form (attn_bwd_dq_tc_kernel / attn_bwd_dkdv_tc_kernel): the gate's
    gradient_accuracy judgment green on the smoke gradient cases and on sequences longer than a
    query and a KV block (one of them chunked, Lq < Lk), every gradient invariance transform bitwise
    with its planted control caught, the same bits run to run, and bits that differ from the FMA
    form's (so the form did run). Head dims 32 (smoke), 64 and 128 (GQA 8 / 2) at sequence lengths
    that end inside a 16-row MMA tile."""
    from rl_engine.ops.attention import cuda as attn_cuda
    from rl_engine.ops.attention.spec import make_case

    spec = get_spec("attention")
    contract = load_contract()
    cases = list(spec.build_grad_cases(SMOKE, GRAD_SEED, cuda_device))
    cases += [make_case(SMOKE, 7, cuda_device, (1, 0, 13, 70, 150)),
              make_case(SMOKE, 8, cuda_device, (1, 0, 13, 70, 150), (1, 0, 5, 33, 77))]
    for d in (64, 128):
        cases.append(make_case(dataclasses.replace(SMOKE, heads=8, kv_heads=2, head_dim=d), 9 + d, cuda_device, (37, 130)))
    with _attention_bwd_form("tensor_cores"):
        prepared = [prepare_gradient(spec, c) for c in cases]
        status, reason, details = gradient_accuracy(spec, attention_cuda, prepared, contract)
        _assert_green("attention", "gradient", status, reason, details)
        case = spec.build_grad_cases(SMOKE, GRAD_SEED, cuda_device)[0]
        for name in TRANSFORMS:
            fn = spec.transforms.get(name)
            if not callable(fn):
                continue
            pairs = fn(attention_cuda, case, "gradient", False)
            assert pairs, f"attention.{name} produced no comparisons"
            bad = [p.label for p in pairs if not _bits_equal(p.canonical, p.transformed)]
            assert not bad, f"attention.{name} (gradient, tensor cores) not bitwise equal: {bad[:5]}"
            planted = fn(attention_cuda, case, "gradient", True)
            assert any(not _bits_equal(p.canonical, p.transformed) for p in planted), f"{name}: planted change not caught"
        tc = [_attention_grads(c) for c in cases[-3:]]
        assert all(_bits_equal(a, b) for g1, g2 in zip(tc, [_attention_grads(c) for c in cases[-3:]]) for a, b in zip(g1, g2))
    with _attention_bwd_form("fma"):
        fma = [_attention_grads(c) for c in cases[-3:]]
    assert any(not _bits_equal(a, b) for g1, g2 in zip(tc, fma) for a, b in zip(g1, g2)), \
        "the tensor-core form gave the FMA form's bits: it did not run"
    assert attn_cuda.BWD_FORMS["fma"] == 0


def _attention_grads(case):
    """(dq, dk, dv) of attention_cuda on ``case`` with a fixed upstream gradient."""
    inp = case.inputs
    q, k, v = (inp[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v"))
    out = attention_cuda(q, k, v, inp["cu_seqlens_q"], inp["cu_seqlens_k"], inp["scale"])
    g = torch.Generator(device="cpu").manual_seed(3)
    out.backward(torch.randn(out.shape, generator=g).to(out.dtype).to(out.device))
    return q.grad, k.grad, v.grad


def test_attention_bwd_form_is_checked(cuda_device):
    """Forms outside BWD_FORMS are refused before anything runs."""
    from rl_engine.ops.attention import cuda as attn_cuda

    for bad in ("tensor-cores", "", 1, None):
        with pytest.raises(InputError, match="attention backward form"):
            attn_cuda.set_bwd_form(bad)


def test_attention_bwd_default_form_is_the_declared_one(cuda_device):
    """The library's default forward and backward are the declared forms, as contract ws1-c1-v8's
    declared_fma.attention says (its text names the wgmma steps of both backends)."""
    from rl_engine.ops.attention import cuda as attn_cuda

    text = load_contract().data["declared_exceptions"]["fp_contraction"]["declared_fma"]["attention"]
    assert "wgmma" in text and "declared forms" in text
    old = attn_cuda.set_bwd_form("fma"), attn_cuda.set_fwd_form("fma")
    try:
        assert old == ("declared", "declared")
    finally:
        attn_cuda.set_bwd_form(old[0])
        attn_cuda.set_fwd_form(old[1])


def test_attention_empty_batch_and_zero_length(cuda_device):
    q, k, v, cu = _varlen([0, 3, 0], 2, 1, 16, 13, cuda_device)
    out = attention_cuda(q, k, v, cu, cu, 0.25)
    assert out.shape == q.shape
    empty = torch.zeros((0, 2, 16), dtype=torch.bfloat16, device=cuda_device)
    cu0 = torch.zeros((1,), dtype=torch.int32, device=cuda_device)
    assert attention_cuda(empty, empty[:, :1], empty[:, :1], cu0, cu0, 0.25).shape == (0, 2, 16)


def test_attention_unsupported_head_dim_raises():
    q = torch.zeros((2, 1, 512), dtype=torch.bfloat16)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(InputError, match="head dim"):
        attention_cuda(q, q, q, cu, cu, 0.1)


# ------------------------------------------ attention: the declared forward form (attention_tc.cu)
def _attention_fwd_form(form: str):
    """The cuda_bf16 attention forward and decode in ``form`` (attention.cuda.FWD_FORMS) inside the block."""
    from rl_engine.ops.attention import cuda as attn_cuda

    return _library_setting(attn_cuda.set_fwd_form, form)


def _tc_prefill_cases(device, d):
    """``(name, q, k, v, cu_q, cu_k)`` at head dim ``d``: packed prefill with lengths that end on and
    inside the 64-row tiles, GQA groups 2 and 4, a chunk of queries against a longer prefix (Lq < Lk),
    and non-finite values at the last key of each sequence (visible only to its last query, masked
    for every other row: NaN and inf in V, and inf in K)."""
    out = []
    for name, lens_k, lens_q, h, hkv in (("packed", (1, 64, 65, 130), None, 4, 2), ("gqa4", (70, 3), None, 8, 2),
                                         ("chunk", (150, 64), (86, 1), 4, 2)):
        lens_q = lens_q or lens_k
        q = _bf16((sum(lens_q), h, d), 31 + d, device)
        k = _bf16((sum(lens_k), hkv, d), 32 + d, device)
        v = _bf16((sum(lens_k), hkv, d), 33 + d, device)
        cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=device)
        out.append((name, q, k, v, cu_q, cu_k))
    name, q, k, v, cu_q, cu_k = out[0]
    k, v = k.clone(), v.clone()
    for end in cu_k[1:].tolist():
        v[end - 1, :, : d // 2] = float("nan")
        v[end - 1, :, d - 1] = float("inf")
    k[int(cu_k[2]) - 1, 1] = float("inf")
    out.append(("nonfinite_last_key", q, k, v, cu_q, cu_k))
    return out


def _tc_decode_case(device, d, h=10, hkv=2):
    """``(q [B, H, D], k_cache, v_cache, seqlens)``: lengths 0, 1, 64, 65 and 130, NaN in every cache
    slot past a length (masked means absent), query groups of 5 (a padded 64-row tile)."""
    lens = (0, 1, 64, 65, 130)
    kc = _bf16((len(lens), 140, hkv, d), 41 + d, device)
    vc = _bf16((len(lens), 140, hkv, d), 42 + d, device)
    for i, n in enumerate(lens):
        kc[i, n:] = float("nan")
        vc[i, n:] = float("nan")
    return _bf16((len(lens), h, d), 43 + d, device), kc, vc, torch.tensor(lens, dtype=torch.int32, device=device)


def _tc_cross_mismatches(device, d) -> list[str]:
    """Bitwise comparisons of the Triton attention (``ROW_SUM_PINNED`` as the caller set it) and the
    cuda_bf16 attention (in the caller's forward form): prefill outputs and ``lse`` of
    :func:`_tc_prefill_cases`, decode outputs of :func:`_tc_decode_case`; returns the mismatches.
    On a CPU a NaN's sign and payload come from the host, not from the kernels: the interpreter
    casts FP32 to BF16 with PyTorch's CPU cast (every NaN -> 0xFFFF) where the emulation's
    ``__float2bfloat16_rn`` gives 0x7FFF as ``cvt.rn.bf16.f32`` does on the GPU; there NaNs are compared
    by position only. On the GPU the contract's NaN policy applies."""
    from rl_engine.ops.attention import cuda as attn_cuda, triton as attn_triton
    from rl_engine.ops.attention._checks import LaunchPlan

    policy = load_contract().nan_policy

    def compare(path, x, y):
        if device.type == "cpu":  # NaN signs are the host's here (see the docstring); positions must agree
            x, y = (torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t) for t in (x, y))
        if not (rep := compare_bitwise(path, x, y, policy)).passed:
            bad.append(rep.summary())

    bad = []
    with torch.no_grad():
        for name, q, k, v, cu_q, cu_k in _tc_prefill_cases(device, d):
            lq, lk = (cu_q[1:] - cu_q[:-1]).tolist(), (cu_k[1:] - cu_k[:-1]).tolist()
            plan = LaunchPlan(len(lq), max(lq), max(lk))
            a = attn_triton.attention_fwd(q, k, v, cu_q, cu_k, d ** -0.5, plan)
            b = attn_cuda.attention_fwd(q, k, v, cu_q, cu_k, d ** -0.5, plan)
            compare(f"D{d}.{name}.out", a[0], b[0])
            compare(f"D{d}.{name}.lse", a[1], b[1])
        q, kc, vc, seqlens = _tc_decode_case(device, d)
        compare(f"D{d}.decode", attn_triton.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5),
                attn_cuda.attention_decode_fwd(q, kc, vc, seqlens, d ** -0.5))
    return bad


def _tc_grad_mismatches(device, d) -> list[str]:
    """Bitwise comparisons of the two backends' attention gradients (dq, dk, dv; the forms and the
    Triton pin as the caller set them) on :func:`_tc_prefill_cases` under an upstream gradient that is
    NaN in a few columns of one query row (the first query of the second sequence, which sees one
    key: masked means absent keeps it out of every other key's dK / dV); NaNs compared as in
    :func:`_tc_cross_mismatches`."""
    from rl_engine.ops.attention.api import attention_triton

    policy = load_contract().nan_policy
    bad = []
    for name, q, k, v, cu_q, cu_k in _tc_prefill_cases(device, d):
        up = _bf16(q.shape, 61 + d, device)
        up[int(cu_q[1]), :, :4] = float("nan")
        grads = []
        for fn in (attention_triton, attention_cuda):
            qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            fn(qq, kk, vv, cu_q, cu_k, d ** -0.5).backward(up)
            grads.append((qq.grad, kk.grad, vv.grad))
        for what, x, y in zip(("dq", "dk", "dv"), *grads):
            if device.type == "cpu":
                x, y = (torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t) for t in (x, y))
            if not (rep := compare_bitwise(f"D{d}.{name}.{what}", x, y, policy)).passed:
                bad.append(rep.summary())
    return bad


@pytest.mark.parametrize("d", [64, 128])
def test_declared_attention_delta_adds_in_the_declared_order(cuda_device, d):
    """The declared backward's ``delta = rowsum(O * dO)`` (attn_delta_declared_kernel) gives the
    declared order's bits (``_head_dim_sum``'s: the model in tests/ops/_helpers.py) on rows where the
    order shows (a cancelling 2^24 pair among values in [0.5, 1.5), dO = 1 so the products are O).
    The gradients of the test below are too coarse to see a delta order (tried: a fold in place of
    the tree passed it). Control: the backward's own tensor-core form (a 32-lane butterfly) differs."""
    from _helpers import cancelling_rows, declared_head_dim_sum

    from rl_engine.backends.cuda_launch import launch
    from rl_engine.ops.attention import cuda as attn_cuda

    o = cancelling_rows(40, d, seed=11 + d, step=5).to(torch.bfloat16).reshape(20, 2, d).to(cuda_device)
    do = torch.ones_like(o)
    expected = declared_head_dim_sum(o.reshape(40, d).float().cpu()).reshape(20, 2).t()

    def delta(form):
        out = torch.full((2, 20), float("nan"), dtype=torch.float32, device=cuda_device)
        with _library_setting(attn_cuda.set_bwd_form, form):
            launch(o.device, "rl_attention_bwd_delta", o, do, out, 20, 2, d, o.stride(0), o.stride(1), do.stride(0),
                   do.stride(1), out.stride(0))
        return out.cpu()

    assert torch.equal(delta("declared").view(torch.int32), expected.contiguous().view(torch.int32))
    assert not torch.equal(delta("tensor_cores").view(torch.int32), expected.contiguous().view(torch.int32)), \
        "the rows do not tell the orders apart: the check could not fail"


@pytest.mark.parametrize("d", [64, 128])
def test_declared_attention_backward_gives_the_triton_bits(cuda_device, d, monkeypatch):
    """With the declared forward and backward forms the cuda_bf16 attention gradients are the Triton
    backend's (``ROW_SUM_PINNED``) bit for bit: dq, dk, dv on packed, GQA, chunked and non-finite
    cases with a NaN in the upstream gradient (on a CPU, the interpreter against the emulation: the
    sequences; on the GPU the instructions). Control: the backward's own tensor-core form (mma.sync
    products, expf, its 32-lane delta sum) against the same Triton gradients must differ."""
    from rl_engine.ops.attention import cuda as attn_cuda, triton as attn_triton

    monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", True)
    with _attention_fwd_form("declared"), _library_setting(attn_cuda.set_bwd_form, "declared"):
        bad = _tc_grad_mismatches(cuda_device, d)
    assert not bad, f"D {d}: the declared backward and the Triton backward differ: " + "; ".join(bad[:4])
    if d == 64:
        with _attention_fwd_form("declared"), _library_setting(attn_cuda.set_bwd_form, "tensor_cores"):
            assert _tc_grad_mismatches(cuda_device, d), "the backward's own tensor-core form gave the Triton bits"


@pytest.mark.parametrize("d", [64, 128])
def test_declared_attention_forward_gives_the_triton_bits(cuda_device, d, monkeypatch):
    """The declared forward form is the Triton backend's forward with ``ROW_SUM_PINNED``, written
    out in CUDA: the two give the same bits for the prefill output and ``lse`` (packed, GQA, a chunk,
    non-finite values at masked and at visible keys) and for a decode step (NaN past every length,
    an empty sequence). On a CPU the pair is the Triton interpreter and the host emulation, whose MMA
    and exp are the same models (tests/cuda_emu/emu.h): what is compared is the sequence (tiles, key
    blocks, score masking, the row-sum order, rounding P to BF16 for P V, the absent-value rule,
    the final division); the GPU compares the instructions (wgmma, ex2.approx)."""
    from rl_engine.ops.attention import triton as attn_triton

    monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", True)
    with _attention_fwd_form("declared"):
        bad = _tc_cross_mismatches(cuda_device, d)
    assert not bad, f"D {d}: the declared form and the Triton forward differ: " + "; ".join(bad[:4])


def test_declared_attention_control_other_sequences_differ(cuda_device, monkeypatch):
    """Negative control of the test above: the CUDA-core form (FP32 P for P V, 16-lane row sums)
    against the pinned Triton forward, and the declared form against the unpinned Triton forward
    on a CPU (the interpreter's ``tl.sum`` is NumPy's pairwise order, not the pinned one), must each
    be caught by the same comparison."""
    from rl_engine.ops.attention import triton as attn_triton

    monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", True)
    with _attention_fwd_form("fma"):
        assert _tc_cross_mismatches(cuda_device, 64), "the CUDA-core form gave the Triton bits"
    if cuda_device.type == "cpu":
        monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", False)
        with _attention_fwd_form("declared"):
            assert _tc_cross_mismatches(cuda_device, 64), "the unpinned interpreter sum gave the pinned bits"


@pytest.mark.parametrize("d", [64, 128])
def test_declared_attention_decode_and_chunks_equal_prefill_rows(cuda_device, d):
    """In the declared form a query's output is bitwise the same in a full prefill, a chunk of
    queries (every split at and around the 64-row tiles) and a decode step in both decode forms
    (``DECLARED_DECODE_FORMS``; the KV cache holding keys 0 .. pos, NaN junk after), for a query group
    of 5 heads; a prefill whose rows do not start on 16-byte boundaries (the 2-byte copy path) gives
    the bits of the aligned one."""
    from rl_engine.ops.attention import cuda as attn_cuda

    h, hkv, lens = 10, 2, [150]
    q, k, v, cu = _varlen(lens, h, hkv, d, 51, cuda_device)
    scale = d ** -0.5
    with torch.no_grad(), _attention_fwd_form("declared"):
        full = attention_cuda(q, k, v, cu, cu, scale)
        for lo, hi in ((0, 1), (1, 64), (64, 65), (65, 150), (100, 150)):
            cq = torch.tensor([0, hi - lo], dtype=torch.int32, device=cuda_device)
            ck = torch.tensor([0, hi], dtype=torch.int32, device=cuda_device)
            assert _bits_equal(attention_cuda(q[lo:hi], k[:hi], v[:hi], cq, ck, scale), full[lo:hi]), (lo, hi)
        steps = (0, 1, 63, 64, 65, 127, 149)
        kc = torch.full((len(steps), 160, hkv, d), float("nan"), dtype=torch.bfloat16, device=cuda_device)
        vc = torch.full_like(kc, float("nan"))
        for i, pos in enumerate(steps):
            kc[i, : pos + 1] = k[: pos + 1]
            vc[i, : pos + 1] = v[: pos + 1]
        seqlens = torch.tensor([p + 1 for p in steps], dtype=torch.int32, device=cuda_device)
        for form in ("walk", "split"):
            with _library_setting(attn_cuda.set_declared_decode_form, form):
                out = attention_decode_cuda(q[list(steps)], kc, vc, seqlens, scale)
            for i, pos in enumerate(steps):
                assert _bits_equal(out[i], full[pos]), (form, pos)
        raw = torch.empty(q.numel() + 1, dtype=torch.bfloat16, device=cuda_device)
        q_odd = raw[1:].view(q.shape)  # every row 2 bytes past a 16-byte boundary
        q_odd.copy_(q)
        assert _bits_equal(attention_cuda(q_odd, k, v, cu, cu, scale), full)
    with torch.no_grad(), _attention_fwd_form("fma"):
        assert not _bits_equal(attention_cuda(q, k, v, cu, cu, scale), full), "the declared form did not run"


def test_declared_attention_decode_ring_wraps_with_the_prefill_bits(cuda_device):
    """Caches of 449, 700 and 1100 keys (8, 11 and 18 KV blocks, so the decode kernel's ring of KV
    blocks wraps several times and the split form's running maximum takes its 16-block loads): a
    decode step gives, for each sequence, the bits of the chunked prefill of its
    last query over the same keys (one query row), in both decode forms. A fault of a decode kernel
    alone fails it (tried at 5214778 with a deeper decode ring: a slot refilled while in use, a short
    prologue); one shared with the prefill's walk fails the Triton-bits tests above instead."""
    from rl_engine.ops.attention import cuda as attn_cuda

    lens, h, hkv, d = (449, 700, 1100), 4, 1, 64
    kc = _bf16((len(lens), max(lens) + 3, hkv, d), 61, cuda_device)
    vc = _bf16((len(lens), max(lens) + 3, hkv, d), 62, cuda_device)
    q = _bf16((len(lens), h, d), 63, cuda_device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=cuda_device)
    scale = d ** -0.5
    with torch.no_grad(), _attention_fwd_form("declared"):
        want = []
        for i, n in enumerate(lens):
            cq = torch.tensor([0, 1], dtype=torch.int32, device=cuda_device)
            ck = torch.tensor([0, n], dtype=torch.int32, device=cuda_device)
            want.append(attention_cuda(q[i : i + 1], kc[i, :n].contiguous(), vc[i, :n].contiguous(), cq, ck, scale)[0])
        for form in ("walk", "split"):
            with _library_setting(attn_cuda.set_declared_decode_form, form):
                out = attention_decode_cuda(q, kc, vc, seqlens, scale)
            for i in range(len(lens)):
                assert _bits_equal(out[i], want[i]), (form, lens[i])


@pytest.mark.parametrize("d", [64, 128])
def test_declared_attention_split_decode_gives_the_walk_bits(cuda_device, d):
    """The split decode step (three launches through a scratch) gives the one-kernel walk's bits,
    NaN positions included: lengths 0, 1, 64, 65 and 130 with NaN past each length, a visible inf in
    K (a NaN score) and a visible NaN in V (the absent-value rule's NaN in the last, masked block and
    a plain NaN in a full one), query groups of 5 (a padded tile) and of 80 (two tiles). Control: a
    cache whose visible keys differ in one element gives other bits in the split form."""
    from rl_engine.ops.attention import cuda as attn_cuda

    scale = d ** -0.5
    for h, hkv in ((10, 2), (80, 1)):
        q, kc, vc, seqlens = _tc_decode_case(cuda_device, d, h, hkv)
        kc[3, 10, 0, 5] = float("inf")  # sequence 3 (65 keys): a visible inf key element
        vc[4, 129, 0, 7] = float("nan")  # sequence 4 (130 keys): a visible NaN in its masked last block
        vc[2, 3, 0, 9] = float("nan")  # sequence 2 (64 keys): a visible NaN in a full block
        with torch.no_grad():
            with _library_setting(attn_cuda.set_declared_decode_form, "walk"):
                walk = attention_decode_cuda(q, kc, vc, seqlens, scale)
            with _library_setting(attn_cuda.set_declared_decode_form, "split"):
                split = attention_decode_cuda(q, kc, vc, seqlens, scale)
                kc2 = kc.clone()
                kc2[4, 100, 0, 3] = kc2[4, 100, 0, 3] + 1
                other = attention_decode_cuda(q, kc2, vc, seqlens, scale)
        assert _bits_equal(split, walk), (h, hkv)
        assert torch.isnan(walk[2]).any() and torch.isnan(walk[4]).any(), "the planted NaNs did not reach the output"
        assert not _bits_equal(other[4], split[4]), "the control's changed key left the split step's bits"


def test_declared_attention_accuracy_and_invariance(cuda_device):
    """The declared forward and backward forms keep every judgment at head dim 64: forward and
    gradient accuracy against the FP32 reference, and each invariance transform bitwise, forward and
    gradient, with its planted control caught."""
    from rl_engine.ops.attention import cuda as attn_cuda

    w = dataclasses.replace(SMOKE, heads=8, kv_heads=2, head_dim=64)
    with _attention_fwd_form("declared"), _library_setting(attn_cuda.set_bwd_form, "declared"):
        _assert_judgments_green("attention", attention_cuda, w, cuda_device, "cuda_bf16 declared forms")


def test_declared_attention_form_is_checked(cuda_device):
    """Forms outside FWD_FORMS / BWD_FORMS are refused; in the declared form a decode step takes the form's one
    kernel, so an explicit CUDA-core decode form or column split is refused before any launch; head
    dims without a tensor-core kernel keep the CUDA-core form (the library says which run it)."""
    from rl_engine.backends.cuda_launch import query
    from rl_engine.ops.attention import cuda as attn_cuda

    for bad in ("tensor-cores", "", 1, None):
        with pytest.raises(InputError, match="attention forward form"):
            attn_cuda.set_fwd_form(bad)
        with pytest.raises(InputError, match="attention backward form"):
            attn_cuda.set_bwd_form(bad)
    assert query("rl_attention_bwd_form", 3) == -1 and query("rl_attention_fwd_form", 2) == -1
    q, kc, vc, seqlens = _tc_decode_case(cuda_device, 64)
    with _attention_fwd_form("fma"):
        assert [query("rl_attention_fwd_uses_tc", d) for d in (32, 64, 128)] == [0, 0, 0]
    with _attention_fwd_form("declared"):
        assert [query("rl_attention_fwd_uses_tc", d) for d in (16, 32, 64, 128, 256)] == [0, 0, 1, 1, 0]
        with pytest.raises(InputError, match="declared attention forward form"):
            attn_cuda.attention_decode_fwd(q, kc, vc, seqlens, 0.125, form="one_pass")
        with pytest.raises(InputError, match="declared attention forward form"):
            attn_cuda.attention_decode_fwd(q, kc, vc, seqlens, 0.125, d_split=2, form="two_launch")
    assert attn_cuda.set_fwd_form("declared") == "declared"  # the library's default (ws1-c1-v8)
    for bad in ("splits", "", 2, None):
        with pytest.raises(InputError, match="declared decode form"):
            attn_cuda.set_declared_decode_form(bad)
    assert query("rl_attention_declared_decode_form", 3) == -1
    unit = 3 * 64 * 4 + 128 * 64  # scratch bytes per (sequence, KV head, tile, key block)
    # the library's choice: the split step up to 8 walk blocks and 64 MiB of scratch, else the walk
    assert query("rl_attention_declared_decode_scratch", 1, 32, 8, 16) == 8 * 16 * unit
    assert query("rl_attention_declared_decode_scratch", 2, 32, 8, 16) == 0
    assert query("rl_attention_declared_decode_scratch", 1, 32, 8, 936) == 8 * 936 * unit  # <= 64 MiB
    assert query("rl_attention_declared_decode_scratch", 1, 32, 8, 937) == 0
    assert query("rl_attention_declared_decode_scratch", 1, 4 * 65, 4, 16) == 4 * 2 * 16 * unit  # two tiles
    assert query("rl_attention_declared_decode_scratch", 1, 8 * 65, 8, 16) == 0  # 16 walk blocks
    with _library_setting(attn_cuda.set_declared_decode_form, "walk"):
        assert query("rl_attention_declared_decode_scratch", 1, 32, 8, 16) == 0
    with _library_setting(attn_cuda.set_declared_decode_form, "split"):
        assert query("rl_attention_declared_decode_scratch", 2, 32, 8, 16) == 2 * 8 * 16 * unit


def _declared_chain_runs(device, on: bool, rollout: bool, monkeypatch) -> dict:
    """``{backend: StyleRun}`` of a 2-layer Qwen3 (head dim 64, GQA 4 / 2) on both backends with every
    declared cross-backend switch ``on`` (Triton: the attention and linear_logp row-sum pins and the
    declared log-sum-exp; cuda_bf16: the declared attention forward) or off: teacher forcing and, with
    ``rollout``, KV-cache rollout decode of two sequences (prompts 5 and 66, completions 12 and 8: the second crosses a 64-key block)."""
    from rl_engine.backends.registry import get_backend
    from rl_engine.chain.config import Qwen3Config
    from rl_engine.chain.fixtures import make_fixture
    from rl_engine.chain.gate import HEAD
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.parity import run_styles
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.ops.attention import triton as attn_triton
    from rl_engine.ops.linear_logp import triton as ll_triton
    from rl_engine.ops.logp import declared

    if device.type == "cpu":  # the host emulation stands in for the GPU the backend's probe asks for
        monkeypatch.setitem(get_backend("cuda_bf16")._cache, "answer", (True, "host emulation (tests only)"))
    for module in (attn_triton, ll_triton):
        monkeypatch.setattr(module, "ROW_SUM_PINNED", on)
    monkeypatch.setattr(declared, "DECLARED_LSE", on)
    cfg = Qwen3Config(vocab_size=600, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1e6,
                      tie_word_embeddings=False, max_position_embeddings=512)
    weights = synthetic_weights(cfg, 3, logit_scale=1.0, device=device)
    batch = make_fixture(((5, 12), (66, 8)), 4, cfg.vocab_size).batch()
    with _attention_fwd_form("declared" if on else "fma"):
        return {b: run_styles(Qwen3Model(weights, b), batch, head=HEAD, rollout=rollout)
                for b in ("triton_cuda_bf16", "cuda_bf16")}


def test_declared_chain_trains_on_one_backend_and_rolls_out_on_the_other(cuda_device, monkeypatch):
    """Issue #34's chain cell in small: with every declared cross-backend switch on, teacher forcing
    on one backend and KV-cache rollout decode on the other give the same logprob bits both ways (the
    strict profile: every token's dlogp exactly 0), and the two backends' teacher forcing is bitwise
    equal. On a CPU: the Triton interpreter and the host emulation, which compares the sequences
    (the MMA and exp are the same models there); the GPU compares the instructions. Control: with the
    switches off (each backend's own sequences) the two teacher-forcing runs differ."""
    from rl_engine.gate.compare import chain_metrics

    strict = load_contract().chain_thresholds("strict")
    runs = _declared_chain_runs(cuda_device, True, True, monkeypatch)
    tr, cu = runs["triton_cuda_bf16"], runs["cuda_bf16"]
    assert torch.equal(tr.train.view(torch.int32), cu.train.view(torch.int32)), "teacher forcing differs across backends"
    for name, (lhs, rhs) in {"triton trains, cuda rolls out": (tr.train, cu.rollout),
                             "cuda trains, triton rolls out": (cu.train, tr.rollout)}.items():
        rep = chain_metrics(lhs, rhs, strict)
        assert rep.passed, f"{name}: {rep.summary()}"
    own = _declared_chain_runs(cuda_device, False, False, monkeypatch)
    assert not chain_metrics(own["triton_cuda_bf16"].train, own["cuda_bf16"].train, strict).passed, \
        "the backends' own sequences gave the same teacher-forcing bits: the check could not fail"


# --------------------------------------------------------------------------------------- logprobs
def test_linear_logp_equals_lm_head_then_logp_bitwise(cuda_device, monkeypatch):
    """One semantics for scoring (DESIGN row 14): fused and unfused give the same bits, also when V
    spans several 4096-wide chunks, while ``logp`` runs the CUDA backend's own chunked sequence
    (``logp.declared.DECLARED_LSE`` off); the declared sequence is ``logp``'s and
    ``batch_invariant_logp``'s only, so with it on the two paths differ in the last bits."""
    from rl_engine.ops.logp import declared

    monkeypatch.setattr(declared, "DECLARED_LSE", False)
    for v in (1000, 9000):
        h = _bf16((6, 48), 21 + v, cuda_device)
        w = _bf16((v, 48), 22 + v, cuda_device, scale=0.5)
        t = torch.randint(0, v, (6,), generator=torch.Generator().manual_seed(v)).to(cuda_device)
        with torch.no_grad():
            fused = linear_logp_cuda(h, w, t, 0.8)
            unfused = logp_cuda(lm_head_cuda(h, w), t, 0.8)
        assert _bits_equal(fused, unfused), v


def test_linear_logp_multi_chunk_accuracy_and_rows(cuda_device):
    contract = load_contract()
    v, e = 9000, 40
    h = _bf16((5, e), 31, cuda_device)
    w = _bf16((v, e), 32, cuda_device, scale=0.5)
    t = torch.randint(0, v, (5,), generator=torch.Generator().manual_seed(3)).to(cuda_device)
    g = torch.randn(5, generator=torch.Generator().manual_seed(4)).to(cuda_device)
    hl, wl = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = linear_logp_cuda(hl, wl, t)
    out.backward(g)
    hr, wr = h.float().requires_grad_(True), w.float().requires_grad_(True)
    ref = get_spec("linear_logp").impls["reference_fp32"](hidden=hr, weight=wr, targets=t, temperature=1.0)
    ref.backward(g)
    tf = contract.tolerance("forward", "logprob", "float32")
    torch.testing.assert_close(out, ref.detach(), atol=tf.atol, rtol=tf.rtol)
    tg = contract.tolerance("gradient", "logprob")
    torch.testing.assert_close(hl.grad.float(), hr.grad, atol=tg.atol, rtol=tg.rtol)
    torch.testing.assert_close(wl.grad.float(), wr.grad, atol=tg.atol, rtol=tg.rtol)
    with torch.no_grad():
        for r in (0, 4):
            assert _bits_equal(linear_logp_cuda(h[r:r + 1], w, t[r:r + 1]), out.detach()[r:r + 1])


@pytest.fixture
def tensor_core_logp_bwd(monkeypatch):
    """linear_logp's backward on tensor cores (the hi / lo GEMMs) for the test."""
    from rl_engine.ops.linear_logp import cuda as ll_cuda

    monkeypatch.setattr(ll_cuda, "TENSOR_CORE_BWD_ON_CUDA", True)


def test_linear_logp_tensor_core_backward_accuracy_and_invariance(cuda_device, tensor_core_logp_bwd):
    """The hi / lo tensor-core backward (TENSOR_CORE_BWD_ON_CUDA) meets the contract's gradient
    tolerances on the smoke cases and a three-chunk vocabulary (the FP32 dhidden accumulator carried
    across chunks), and keeps the batch and layout transforms bitwise (the layout one reaches the
    operand copies the hi / lo GEMM needs), each with its planted control (the others take 10 s each in
    the host emulation; the gate runs them all)."""
    spec = get_spec("linear_logp")
    contract = load_contract()
    prepared = [prepare_gradient(spec, c) for c in spec.build_grad_cases(SMOKE, GRAD_SEED, cuda_device)]
    status, reason, details = gradient_accuracy(spec, CUDA_IMPLS["linear_logp"], prepared, contract)
    _assert_green("linear_logp", "gradient", status, reason, details)
    case = spec.build_grad_cases(SMOKE, GRAD_SEED, cuda_device)[0]
    for name in ("batch", "layout"):
        fn = spec.transforms[name]
        pairs = fn(CUDA_IMPLS["linear_logp"], case, "gradient", False)
        assert pairs and all(_bits_equal(p.canonical, p.transformed) for p in pairs), name
        planted = fn(CUDA_IMPLS["linear_logp"], case, "gradient", True)
        assert any(not _bits_equal(p.canonical, p.transformed) for p in planted), f"{name}: control not caught"
    v, e, rows = 8200, 16, 9
    h = _bf16((rows, e), 31, cuda_device)
    w = _bf16((v, e), 32, cuda_device, scale=0.5)
    t = torch.randint(0, v, (rows,), generator=torch.Generator().manual_seed(3)).to(cuda_device)
    g = torch.randn(rows, generator=torch.Generator().manual_seed(4)).to(cuda_device)
    hl, wl = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    linear_logp_cuda(hl, wl, t).backward(g)
    hr, wr = h.float().requires_grad_(True), w.float().requires_grad_(True)
    get_spec("linear_logp").impls["reference_fp32"](hidden=hr, weight=wr, targets=t, temperature=1.0).backward(g)
    tg = contract.tolerance("gradient", "logprob")
    torch.testing.assert_close(hl.grad.float(), hr.grad, atol=tg.atol, rtol=tg.rtol)
    torch.testing.assert_close(wl.grad.float(), wr.grad, atol=tg.atol, rtol=tg.rtol)
    if cuda_device.type == "cuda":  # the warpgroup hi / lo GEMMs (forms 3-5) against mma.sync's, on the hardware
        for form in (3, 4, 5):
            with _tree_gemm_form(form):
                h3, w3 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
                linear_logp_cuda(h3, w3, t).backward(g)
            assert _bits_equal(h3.grad, hl.grad) and _bits_equal(w3.grad, wl.grad), f"form {form}'s hi / lo GEMMs"


def test_gemm_hilo_equals_the_triton_backward_kernels(cuda_device):
    """rl_split_hilo + rl_gemm_hilo run the products of the Triton backend's _bwd_dhidden_kernel and
    _bwd_dweight_kernel in the same order: in the CPU emulations (the CUDA host emulation's mma and
    the Triton interpreter's dot both add the exact products one at a time) dhidden's FP32
    accumulator after a first chunk, the BF16 dhidden after a second and each chunk's dweight are bit
    for bit the Triton kernels', with T, E and the chunk width off the tile and block sizes, from the
    pipelined kernel, (form 3) the warpgroup one, (form 4) the warp-specialised one and (form 5) that
    with TMA copies. Control: the
    lo parts left out change the bits."""
    if cuda_device.type != "cpu":
        pytest.skip("the bitwise comparison is of the two CPU emulations (on the GPU: the cross-backend gate)")
    from rl_engine.ops.linear_logp import cuda as ll_cuda
    from rl_engine.ops.linear_logp import triton as ll_triton

    t, e, n0, n1 = 70, 136, 200, 77  # T and E past one 128 tile, chunks not multiples of 64
    cv = ll_triton.CHUNK_V
    gen = torch.Generator().manual_seed(11)
    hidden = _bf16((t, e), 12, cuda_device)
    weight = _bf16((n0 + n1, e), 13, cuda_device, scale=0.3)
    d = [torch.randn((t, n), generator=gen) * 1e-3 for n in (n0, n1)]
    # Triton (interpreter): the chunk buffers the launcher fills, then its two kernels per chunk.
    tm, tn, tw, ts = ll_triton.GRAD_TILE
    acc_t = torch.empty((t, e), dtype=torch.float32)
    dh_t = torch.empty((t, e), dtype=torch.bfloat16)
    dw_t = torch.empty((n0 + n1, e), dtype=torch.bfloat16)
    acc_after_first = None
    for c, (v_base, dc) in enumerate(((0, d[0]), (n0, d[1]))):
        n_local = dc.shape[1]
        hi_t = torch.zeros((t, cv), dtype=torch.bfloat16)
        lo_t = torch.zeros((t, cv), dtype=torch.bfloat16)
        hi_t[:, :n_local] = dc.to(torch.bfloat16)
        lo_t[:, :n_local] = (dc - hi_t[:, :n_local].float()).to(torch.bfloat16)
        ll_triton._bwd_dhidden_kernel[(-(-t // tm), -(-e // tn))](
            hi_t, lo_t, weight, acc_t, dh_t, t, e, v_base, n_local, weight.stride(0), FIRST=c == 0, LAST=c == 1,
            CHUNK_V=cv, BLOCK=ll_triton.GRAD_BLOCK, UPCAST=True, TILE_M=tm, TILE_N=tn, num_warps=tw, num_stages=ts)
        if c == 0:
            acc_after_first = acc_t.clone()
        ll_triton._bwd_dweight_kernel[(-(-n_local // tm), -(-e // tn))](
            hi_t, lo_t, hidden, dw_t, t, e, v_base, n_local, hidden.stride(0), CHUNK_V=cv,
            BLOCK=ll_triton.GRAD_BLOCK, UPCAST=True, TILE_M=tm, TILE_N=tn, num_warps=tw, num_stages=ts)
    # CUDA (host emulation): the same chunks through rl_split_hilo and rl_gemm_hilo.
    from rl_engine.backends.cuda_launch import launch

    assert ll_cuda.GRAD_BLOCK == ll_triton.GRAD_BLOCK
    hi = torch.empty((t, 256), dtype=torch.bfloat16)
    lo = torch.empty_like(hi)
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    tma_before = dg_cuda.form_launches(5)
    for form in (0, 3, 4, 5):
        acc_c = torch.empty((t, e), dtype=torch.float32)
        dh_c = torch.empty((t, e), dtype=torch.bfloat16)
        dw_c = torch.empty((n0 + n1, e), dtype=torch.bfloat16)
        with _tree_gemm_form(form):
            for c, (v_base, dc) in enumerate(((0, d[0]), (n0, d[1]))):
                n_local = dc.shape[1]
                launch(cuda_device, "rl_split_hilo", dc, dc.stride(0), hi, lo, hi.stride(0), t, n_local)
                h_c, l_c = hi[:, :n_local], lo[:, :n_local]
                assert torch.equal(h_c, dc.to(torch.bfloat16))
                w_c = weight[v_base:v_base + n_local]
                ll_cuda._gemm_hilo(h_c, l_c, w_c, dh_c if c == 1 else acc_c, None if c == 0 else acc_c)
                if c == 0:
                    assert torch.equal(acc_c.view(torch.int32), acc_after_first.view(torch.int32)), \
                        f"FP32 dhidden accumulator, form {form}"
                ll_cuda._gemm_hilo(h_c.t(), l_c.t(), hidden, dw_c[v_base:v_base + n_local], None)
        assert _bits_equal(dh_c, dh_t), f"dhidden, form {form}"
        assert _bits_equal(dw_c, dw_t), f"dweight, form {form}"
    assert dg_cuda.form_launches(5) > tma_before, "form 5 never ran its TMA copies"
    zero = torch.zeros_like(hi)
    no_lo = torch.empty((n0, e), dtype=torch.bfloat16)
    launch(cuda_device, "rl_split_hilo", d[0], d[0].stride(0), hi, lo, hi.stride(0), t, n0)
    ll_cuda._gemm_hilo(hi[:, :n0].t(), zero[:, :n0].t(), hidden, no_lo, None)
    assert not _bits_equal(no_lo, dw_t[:n0])


def test_logp_pitfalls_p4_p11(cuda_device):
    tol = load_contract().tolerance("forward", "logprob", "float32")
    v = 151936
    zeros = torch.zeros((3, v), device=cuda_device)
    zeros[1, 7] = -20.0
    zeros[2, 9] = 10.0
    t = torch.tensor([5, 7, 9], device=cuda_device)
    out = logp_cuda(zeros, t)
    want = torch.tensor([-11.931215, -31.931208, -2.0665891], device=cuda_device)
    torch.testing.assert_close(out, want, atol=tol.atol, rtol=tol.rtol)
    p11 = logp_cuda(torch.tensor([[2.0, 0.0]], device=cuda_device), torch.tensor([0], device=cuda_device), 0.6)
    torch.testing.assert_close(p11, torch.tensor([-0.0350524], device=cuda_device), atol=tol.atol, rtol=tol.rtol)


def test_logp_neg_inf_and_nan(cuda_device):
    x = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")], [float("-inf")] * 3 + [1.5],
                      [0.0, float("nan"), 0.0, 0.0]], device=cuda_device)
    out = logp_cuda(x, torch.tensor([2, 3, 0], device=cuda_device))
    assert _bits_equal(out[:2], torch.tensor([-math.log(2.0), 0.0], dtype=torch.float32, device=cuda_device))
    assert bool(torch.isnan(out[2]))


def test_batch_invariant_logp_rows_equal_logp_and_masked_rows_unread(cuda_device):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn((3, 4, 5000), generator=g) * 2).to(cuda_device)
    t = torch.randint(0, 5000, (3, 4), generator=g).to(cuda_device)
    m = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool, device=cuda_device)
    x[~m] = float("nan")
    t[~m] = -100
    out = batch_invariant_logp_cuda(x, t, m)
    assert _bits_equal(out[m], logp_cuda(x[m], t[m]))
    assert _bits_equal(out[~m], torch.zeros(int((~m).sum()), device=cuda_device))


@pytest.mark.gpu
def test_p5_fused_linear_logprob_fp32_logits(cuda_device):
    """P5 at the real vocabulary size (GPU only: V = 151936 is slow in the emulation)."""
    if cuda_device.type != "cuda":
        pytest.skip("GPU-sized pitfall")
    tol = load_contract().tolerance("forward", "logprob", "float32")
    v = 151936
    w = torch.zeros((v, 2), dtype=torch.bfloat16, device=cuda_device)
    w[0] = torch.tensor([40.0, 40.25])
    w[1] = torch.tensor([40.0, 40.0])
    h = torch.ones((2, 2), dtype=torch.bfloat16, device=cuda_device)
    t = torch.tensor([0, 1], device=cuda_device)
    want = torch.tensor([-0.5759394, -0.8259394], device=cuda_device)
    torch.testing.assert_close(linear_logp_cuda(h, w, t), want, atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(logp_cuda(lm_head_cuda(h, w), t), want, atol=tol.atol, rtol=tol.rtol)


# ------------------------------------------------------------------------------- norms, rope, misc
def test_rms_norm_p2_rounding_orders_exact_bits(cuda_device):
    x = torch.tensor([1.0, 1.0, 1.0, 2.0] * 32, dtype=torch.bfloat16, device=cuda_device)[None].repeat(3, 1)
    w = torch.full((128,), 1.5, dtype=torch.bfloat16, device=cuda_device)
    hf = rms_norm_cuda(x, w, 1e-6, "hf")
    fused = rms_norm_cuda(x, w, 1e-6, "fused")
    assert hf[:, :4].cpu().view(torch.int16).tolist() == [[0x3F92, 0x3F92, 0x3F92, 0x4012]] * 3
    assert fused[:, :4].cpu().view(torch.int16).tolist() == [[0x3F91, 0x3F91, 0x3F91, 0x4011]] * 3
    q = qk_norm_cuda(x.view(3, 4, 32), w[:32], 1e-6, "hf")
    assert q[:, :, :4].reshape(-1, 4).cpu().view(torch.int16).tolist() == [[0x3F92, 0x3F92, 0x3F92, 0x4012]] * 12


@pytest.mark.parametrize("shape", [(64 * 37 + 5, 320), (600, 4, 128)], ids=["rows", "heads-rope"])
def test_rms_norm_dweight_sums_its_chunks_in_order(cuda_device, shape):
    """The CUDA backend's weight gradient (partials over 64-row chunks, head rows in 128-column blocks
    stepping each row's token and head; then the partials added in chunk order, loaded 32 at a time)
    gives the Triton backend's dweight bits over more than 32 chunks with a partial last one, for
    [T, E] rows and for QK-norm + RoPE head rows (the rotation taken back in the loads). The input
    makes the chunk order decide the BF16 result: chunks 1 and 2 hold only 2^30-sized contributions
    that cancel exactly (one token each, same x and rotation, opposite dy; every other row of the two
    chunks has dy = 0), so in chunk order chunk 0's small partial is swallowed and chunk 3's survives,
    while a pairwise grouping ((0 + 1) + (2 + 3)) swallows both and the reverse order keeps chunk 0's
    (each seen to fail the comparison with the kernel changed so). Control: the tokens in reverse
    order give other dweight bits on the CUDA backend."""
    from rl_engine.ops.rms_norm import cuda as rn_cuda
    from rl_engine.ops.rms_norm import triton as rn_triton
    from rl_engine.ops.rope.api import cos_sin

    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g).to(torch.bfloat16)
    dy = torch.randn(shape, generator=g).to(torch.bfloat16)
    heads = len(shape) == 3
    per_chunk = 64 // shape[1] if heads else 64  # tokens per 64-row chunk
    first, second = per_chunk, 2 * per_chunk  # the first tokens of chunks 1 and 2
    dy[first:second + per_chunk] = 0.0
    x[second] = x[first]
    dy[first] = 2.0 ** 30  # a power of two: exact in BF16
    dy[second] = -(2.0 ** 30)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(torch.bfloat16)
    x, dy, w = x.to(cuda_device), dy.to(cuda_device), w.to(cuda_device)
    rope = None
    if heads:
        cos, sin = cos_sin(torch.arange(shape[0], device=cuda_device), 1e6, shape[-1])
        cos[second], sin[second] = cos[first], sin[first]  # the same rotation for the cancelling rows
        rope = (cos.contiguous(), sin.contiguous())
    _, rstd = rn_triton.rms_norm_fwd(x, w, 1e-6, True)

    def dweight(impl, x, dy, rstd, rope):
        return impl.rms_norm_bwd(x, w, dy, rstd, False, True, rope=rope)[1]

    want = dweight(rn_triton, x, dy, rstd, rope)
    got = dweight(rn_cuda, x, dy, rstd, rope)
    assert _bits_equal(got, want), "the CUDA dweight differs from the Triton backend's"
    flip_rope = None if rope is None else tuple(a.flip(0).contiguous() for a in rope)
    rstd_flip = rstd.view(shape[0], -1).flip(0).reshape(-1).contiguous()
    flipped = dweight(rn_cuda, x.flip(0).contiguous(), dy.flip(0).contiguous(), rstd_flip, flip_rope)
    assert not _bits_equal(flipped, got), "the chunk order does not decide this input's dweight"


def test_swiglu_both_load_widths_give_the_triton_bits(cuda_device):
    """SwiGLU forward and backward on the CUDA backend give the Triton backend's bits in the 16-byte
    form (columns a multiple of 8, rows 16-byte aligned: a packed [T, 2F] projection's gate / up
    halves, a partial last block of 2048 columns) and in the 2-byte form (odd columns; an operand
    one element off a 16-byte boundary), on values whose sigmoid saturates both ways. Control: the
    16-byte form's output differs from the same call with gate and up swapped (SwiGLU is not
    symmetric), so a kernel that read its operands from the wrong places would fail."""
    from rl_engine.ops.swiglu import cuda as sw_cuda
    from rl_engine.ops.swiglu import triton as sw_triton

    g = torch.Generator().manual_seed(SEED + 61)
    t, f = 5, 2 * 2048 + 8 * 3

    def draw(*shape):
        v = torch.randn(*shape, generator=g) * 4.0
        v.view(-1)[:4] = torch.tensor([-100.0, 100.0, -0.0, 1e-8])  # sigmoid 0, 1; signed zero; tiny
        return v.to(torch.bfloat16).to(cuda_device)

    packed = draw(t, 2 * f)
    cases = {"16-byte": (packed[:, :f], packed[:, f:], draw(t, f)),
             "odd columns": (draw(t, f + 1), draw(t, f + 1), draw(t, f + 1)),
             "misaligned": (draw(t, f + 1)[:, 1:], draw(t, f), draw(t, f))}
    for name, (gate, up, dy) in cases.items():
        y = sw_cuda.swiglu_fwd(gate, up)
        assert _bits_equal(y, sw_triton.swiglu_fwd(gate, up)), f"{name}: forward"
        for got, want, what in zip(sw_cuda.swiglu_bwd(gate, up, dy), sw_triton.swiglu_bwd(gate, up, dy),
                                   ("dgate", "dup")):
            assert _bits_equal(got, want), f"{name}: {what}"
    gate, up, _ = cases["16-byte"]
    assert not _bits_equal(sw_cuda.swiglu_fwd(up, gate), sw_cuda.swiglu_fwd(gate, up))


def test_rms_norm_p12_eps_from_config(cuda_device):
    x = torch.full((1, 4), 0.003, dtype=torch.bfloat16, device=cuda_device)
    w = torch.ones(4, dtype=torch.bfloat16, device=cuda_device)
    tol = load_contract().tolerance("forward", "reduction")
    small = rms_norm_cuda(x, w, 1e-6, "fused").float()
    large = rms_norm_cuda(x, w, 1e-5, "fused").float()
    torch.testing.assert_close(small, torch.full_like(small, 0.94887), atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(large, torch.full_like(large, 0.68897), atol=tol.atol, rtol=tol.rtol)


def test_rope_p3_positions(cuda_device):
    from rl_engine.ops.rope.api import cos_sin
    from rl_engine.ops.rope.reference import rope_reference

    pos = torch.tensor([0, 1, 255, 256, 257, 4095, 15962, 32767, 40959], device=cuda_device)
    cos, sin = cos_sin(pos, 1e6, 128)
    x = _bf16((len(pos), 2, 128), 41, cuda_device)
    tol = load_contract().tolerance("forward", "elementwise")
    out = rope_cuda(x, cos, sin)
    torch.testing.assert_close(out.float(), rope_reference(x.float(), cos, sin), atol=tol.atol, rtol=tol.rtol)


def test_embedding_p9_and_empty(cuda_device):
    w = _bf16((50, 16), 51, cuda_device)
    ids = torch.tensor([0, 49, 7, 7], device=cuda_device)
    assert _bits_equal(embedding_cuda(ids, w), w[ids])
    for bad in (50, -1, -100, 2**31 - 1):
        with pytest.raises(InputError):
            embedding_cuda(torch.tensor([bad], device=cuda_device), w)
    empty = embedding_cuda(torch.zeros((0,), dtype=torch.int64, device=cuda_device), w)
    assert empty.shape == (0, 16)


def test_pack_unpack_roundtrip(cuda_device):
    x = _bf16((3, 6, 16), 61, cuda_device)
    cu = torch.tensor([0, 6, 6, 9], dtype=torch.int32, device=cuda_device)
    p = pack_cuda(x, cu)
    assert _bits_equal(p, torch.cat([x[0], x[2, :3]]))
    u = unpack_cuda(p, cu, 6)
    assert _bits_equal(u[0], x[0]) and _bits_equal(u[2, :3], x[2, :3])
    assert bool((u[1] == 0).all()) and bool((u[2, 3:] == 0).all())


# ------------------------------------------------------------------------ validation, availability
def test_bad_inputs_raise_before_launch():
    """Validation runs before any device or build check, so these need neither a GPU nor nvcc."""
    f32 = torch.zeros((2, 4))
    bf = torch.zeros((2, 4), dtype=torch.bfloat16)
    cases = [
        lambda: silu_cuda(f32),
        lambda: swiglu_cuda(bf, torch.zeros((2, 5), dtype=torch.bfloat16)),
        lambda: rope_cuda(torch.zeros((2, 1, 3), dtype=torch.bfloat16), torch.zeros((2, 1)), torch.zeros((2, 1))),
        lambda: embedding_cuda(torch.tensor([4]), bf),
        lambda: pack_cuda(torch.zeros((1, 2, 4), dtype=torch.bfloat16), torch.tensor([0, 3], dtype=torch.int32)),
        lambda: rms_norm_cuda(bf, torch.ones(5, dtype=torch.bfloat16), 1e-6),
        lambda: rms_norm_cuda(bf, torch.ones(4, dtype=torch.bfloat16), 1e-6, "other"),
        lambda: qk_norm_cuda(bf, torch.ones(4, dtype=torch.bfloat16), 1e-6),
        lambda: lm_head_cuda(bf, torch.zeros((3, 5), dtype=torch.bfloat16)),
        lambda: det_gemm_cuda(bf, torch.zeros((5, 3), dtype=torch.bfloat16)),
        lambda: det_gemm_cuda(bf, torch.zeros((4, 3), dtype=torch.bfloat16), tree_depth=3),
        lambda: logp_cuda(bf, torch.tensor([0, 1])),
        lambda: logp_cuda(f32, torch.tensor([0, 4])),
        lambda: logp_cuda(f32, torch.tensor([0, 1]), 0.0),
        lambda: linear_logp_cuda(bf, torch.zeros((3, 4), dtype=torch.bfloat16), torch.tensor([0, 3])),
        lambda: batch_invariant_logp_cuda(f32[None], torch.tensor([[0, 9]]), torch.tensor([[True, True]])),
        lambda: attention_cuda(bf[:, None], bf[:, None], bf[:, None], torch.tensor([0, 2], dtype=torch.int32),
                               torch.tensor([0, 1], dtype=torch.int32), 0.5),
    ]
    for fn in cases:
        with pytest.raises(InputError):
            fn()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_backend_unavailable_without_gpu():
    with pytest.raises(BackendUnavailable, match="CUDA"):
        silu_cuda(torch.zeros((2, 4), dtype=torch.bfloat16))
    with pytest.raises(BackendUnavailable):
        det_gemm_cuda(torch.zeros((2, 4), dtype=torch.bfloat16), torch.zeros((4, 3), dtype=torch.bfloat16))


# ------------------------------------------------------------------------------------ gpu extras
@pytest.mark.gpu
@pytest.mark.parametrize("op", ["embedding", "pack"])
def test_exact_copy_ops_equal_triton_bitwise(cuda_device, op):
    if cuda_device.type != "cuda":
        pytest.skip("compares with the compiled Triton kernels")
    spec = get_spec(op)
    for case in spec.build_cases(SMOKE, SEED, cuda_device):
        with torch.no_grad():
            assert _bits_equal(CUDA_IMPLS[op](**case.inputs), spec.impls["triton_cuda_bf16"](**case.inputs))


# ----------------------------------------------------------------------- cross-backend bits
# The contract pins the elementwise ops' arithmetic (docs/declared-arithmetic.md) so that the two
# backends give the same bits. On the GPU: every op below on the qwen3-8b gate cases. In the host
# emulation (smoke cases): the emulation's expf / logf are the Triton interpreter's exp / log model
# (tests/cuda_emu/emu.h), so silu and swiglu compare there too; which exp the GPU runs on each side
# only the GPU shows.
CROSS_BACKEND_OPS = ("rope", "silu", "swiglu", "rms_norm", "qk_norm")


@pytest.mark.parametrize("op", CROSS_BACKEND_OPS)
def test_triton_and_cuda_give_the_same_bits(cuda_device, op):
    from rl_engine.ops.execute import make_upstream, run_forward, run_gradient

    spec = get_spec(op)
    workload = spec_mod.WORKLOADS["qwen3-8b" if cuda_device.type == "cuda" else "smoke"]
    triton_impl, cuda_impl = spec.impls["triton_cuda_bf16"], CUDA_IMPLS[op]
    mismatches = []
    for case in spec.build_cases(workload, SEED, cuda_device):
        a, b = run_forward(triton_impl, case.inputs), run_forward(cuda_impl, case.inputs)
        pairs = [(f"{case.id}:fwd{i}", x, y) for i, (x, y) in enumerate(zip(a, b))]
        up = make_upstream(a, case.seed + 1000)
        ga = run_gradient(triton_impl, case.inputs, spec.grad_inputs, upstream=up)[1]
        gb = run_gradient(cuda_impl, case.inputs, spec.grad_inputs, upstream=up)[1]
        pairs += [(f"{case.id}:d{n}", ga[n], gb[n]) for n in spec.grad_inputs]
        for path, x, y in pairs:
            rep = compare_bitwise(f"{op}.{path}", x, y, load_contract().nan_policy)
            if not rep.passed:
                mismatches.append(rep.summary())
    assert not mismatches, f"{op}: triton_cuda_bf16 and cuda_bf16 differ: " + "; ".join(mismatches[:4])


def test_cross_backend_check_catches_another_reduction_order(cuda_device):
    """Negative control: RMSNorm whose mean of squares is summed in another order (the control
    kernel: tl.sum over 4 parts, BF16-rounded partials, tl.rsqrt) must be caught by the same
    bitwise comparison against the CUDA backend."""
    from rl_engine.ops.rms_norm.api import rms_norm_rows

    spec = get_spec("rms_norm")
    workload = spec_mod.WORKLOADS["qwen3-8b" if cuda_device.type == "cuda" else "smoke"]
    caught = []
    for case in spec.build_cases(workload, SEED, cuda_device):
        inp = case.inputs
        a = rms_norm_rows(inp["x"], inp["weight"], inp["eps"], inp["order"], "triton_cuda_bf16", split=4)
        b = CUDA_IMPLS["rms_norm"](**inp)
        caught.append(not compare_bitwise("control", a, b, load_contract().nan_policy).passed)
    assert any(caught)


# ------------------------------------------------- the declared log-sum-exp (logp/declared.py)
LSE_OPS = ("logp", "batch_invariant_logp", "linear_logp")


def _lse_edge_inputs(device) -> list[tuple[str, torch.Tensor, torch.Tensor, float]]:
    """``(name, logits [T, V] fp32, targets [T], temperature)`` that walk the declared sequence's
    branches: several 4096-column tiles with the row max in the last one (every tile rescales the
    sum), a tail tile of one column, a first tile that is all ``-inf`` (the reference stays 0, then
    moves), large logits (scale 80), a temperature below 1 and V = 1."""
    g = torch.Generator().manual_seed(SEED + 77)

    def draw(t, v, scale=4.0):
        return (torch.randn(t, v, generator=g, dtype=torch.float64) * scale).to(torch.float32)

    rising = draw(3, 10000)
    rising[:, 9000:] += 30.0
    first_masked = draw(3, 9000)
    first_masked[:, :4096] = float("-inf")
    out = [("rising", rising, 0.7), ("tail1", draw(2, 4097), 1.0), ("first_tile_masked", first_masked, 1.3),
           ("scale80", draw(4, 5000, 80.0), 1.0), ("v1", draw(3, 1), 0.9)]
    cases = []
    for name, x, temp in out:
        t, v = x.shape
        tg = torch.randint(0, v, (t,), generator=g)
        if name == "first_tile_masked":
            tg = torch.randint(4096, v, (t,), generator=g)
        cases.append((name, x.to(device), tg.to(device), temp))
    return cases


def _lse_cross_mismatches(device, op: str) -> list[str]:
    """Bitwise comparisons of the Triton and the CUDA kernels of ``op`` on its gate cases (forward
    outputs and logits gradients under one upstream gradient) and, for ``logp``, on
    :func:`_lse_edge_inputs`; returns the mismatches."""
    from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
    from rl_engine.ops.logp.api import logp_triton

    spec = get_spec(op)
    workload = spec_mod.WORKLOADS["qwen3-8b" if device.type == "cuda" else "smoke"]
    triton_impl, cuda_impl = spec.impls["triton_cuda_bf16"], CUDA_IMPLS[op]
    policy = load_contract().nan_policy
    pairs = []
    for case in spec.build_cases(workload, SEED, device):
        a, b = run_forward(triton_impl, case.inputs), run_forward(cuda_impl, case.inputs)
        pairs += [(f"{case.id}:fwd{i}", x, y) for i, (x, y) in enumerate(zip(a, b))]
    for case in spec.build_grad_cases(workload, GRAD_SEED, device):
        up = make_upstream(run_forward(triton_impl, case.inputs), case.seed + 1000)
        ga = run_gradient(triton_impl, case.inputs, spec.grad_inputs, upstream=up)[1]
        gb = run_gradient(cuda_impl, case.inputs, spec.grad_inputs, upstream=up)[1]
        pairs += [(f"{case.id}:d{n}", ga[n], gb[n]) for n in spec.grad_inputs]
    if op == "linear_logp":  # two V chunks, the second partial, and a temperature below 1
        from rl_engine.ops.linear_logp.api import linear_logp_triton

        g = torch.Generator().manual_seed(SEED + 78)
        h = (torch.randn(21, 64, generator=g) * 0.5).to(torch.bfloat16).to(device)
        w = (torch.randn(4096 + 300, 64, generator=g) * 0.5).to(torch.bfloat16).to(device)
        tg = torch.randint(0, 4096 + 300, (21,), generator=g).to(device)
        outs, grads = [], []
        for fn in (linear_logp_triton, linear_logp_cuda):
            hr, wr = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
            y = fn(hr, wr, tg, 0.7)
            y.backward(torch.linspace(-1.0, 1.0, y.numel(), dtype=torch.float32, device=device))
            outs.append(y.detach())
            grads.append((hr.grad, wr.grad))
        pairs += [("two_chunks:fwd", *outs), ("two_chunks:dhidden", grads[0][0], grads[1][0]),
                  ("two_chunks:dweight", grads[0][1], grads[1][1])]
    if op == "logp":
        for name, x, tg, temp in _lse_edge_inputs(device):
            outs, grads = [], []
            for fn in (logp_triton, logp_cuda):
                xr = x.clone().requires_grad_(True)
                y = fn(xr, tg, temp)
                y.backward(torch.linspace(-1.0, 1.0, y.numel(), dtype=torch.float32, device=device))
                outs.append(y.detach())
                grads.append(xr.grad)
            pairs += [(f"{name}:fwd", *outs), (f"{name}:dlogits", *grads)]
    return [rep.summary() for path, x, y in pairs
            if not (rep := compare_bitwise(f"{op}.{path}", x, y, policy)).passed]


@pytest.mark.parametrize("op", LSE_OPS)
def test_declared_lse_gives_the_same_bits_on_both_backends(cuda_device, op, monkeypatch):
    """With ``logp.declared.DECLARED_LSE`` both backends run one declared sequence: the Triton
    kernel and the CUDA kernels give the same bits, forward and gradient, on the op's gate cases and
    the edge inputs. On a CPU the pair is the Triton interpreter and the host emulation, whose exp /
    log are the same model (tests/cuda_emu/emu.h), so what is compared is the sequence: tiles,
    reference, reduction order, divisions; the GPU compares the real instructions."""
    from rl_engine.ops.logp import declared

    monkeypatch.setattr(declared, "DECLARED_LSE", True)
    bad = _lse_cross_mismatches(cuda_device, op)
    assert not bad, f"{op}: the declared sequence differs between the backends: " + "; ".join(bad[:4])


@pytest.mark.parametrize("op", LSE_OPS)
def test_declared_lse_control_own_sequences_differ(cuda_device, op, monkeypatch):
    """Negative control of the test above: with the switch off each backend runs its own sequence
    (CUDA: 4096-column chunks, per-thread online sums, expf; Triton: tl.sum), and the same
    comparison must find outputs that differ."""
    from rl_engine.ops.logp import declared

    monkeypatch.setattr(declared, "DECLARED_LSE", False)
    assert _lse_cross_mismatches(cuda_device, op), f"{op}: the two backends' own sequences gave equal bits"


@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "cuda_bf16"])
@pytest.mark.parametrize("op", LSE_OPS)
def test_declared_lse_is_accurate_and_invariant(cuda_device, op, backend, monkeypatch):
    """The declared sequence keeps every judgment: forward and gradient accuracy against the FP32
    reference, and each invariance transform bitwise with its planted negative control."""
    from rl_engine.ops.logp import declared

    monkeypatch.setattr(declared, "DECLARED_LSE", True)
    impl = CUDA_IMPLS[op] if backend == "cuda_bf16" else get_spec(op).impls[backend]
    _assert_judgments_green(op, impl, SMOKE, cuda_device, backend)


def test_programmatic_launch_mode_is_set_restored_and_checked(cuda_device):
    """The PDL mode (0 at the library's start) is set and returned by
    ``set_programmatic_launch``, restored by the ``programmatic_launch`` block even when it raises,
    and a mode out of range is refused by Python (ValueError) and by the library (-1, unchanged)."""
    from rl_engine.backends.cuda_launch import programmatic_launch, query, set_programmatic_launch

    start = set_programmatic_launch(0)
    try:
        assert set_programmatic_launch(2) == 0
        assert set_programmatic_launch(1) == 2
        with pytest.raises(RuntimeError, match="inside"):
            with programmatic_launch(2):
                assert set_programmatic_launch(2) == 2
                raise RuntimeError("inside")
        assert set_programmatic_launch(1) == 1
        with pytest.raises(ValueError, match="0, 1 or 2"):
            set_programmatic_launch(3)
        assert query("rl_set_programmatic_launch", 3) == -1
        assert set_programmatic_launch(0) == 1
    finally:
        set_programmatic_launch(start)
