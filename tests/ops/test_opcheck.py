"""Every kernel op is a torch op: ``torch.library.opcheck`` on each torch op of the 13 ops, on
small shapes, for each kernel backend.

``triton_cuda_bf16`` runs here (the Triton CPU interpreter where no GPU is present);
``cuda_bf16`` needs the real library and is marked ``gpu`` (skipped with the reason elsewhere).
Where no GPU is present, ``cuda_bf16`` also runs in the host emulation of its CUDA sources
(``tests/cuda_emu``, as in ``test_cuda_backend.py``): the same Python launchers and argument
lists on CPU tensors, so the torch-op registration of the CUDA path is checked in CI too.

The opcheck utilities run (all four, named explicitly in :data:`TEST_UTILS`):

* ``test_schema``: the schema matches the implementation (nothing mutated, outputs are new
  tensors, not views of an input);
* ``test_autograd_registration``: the autograd formula is registered with
  ``register_autograd``. It bites on the forward ops, called with inputs that require grad. The
  backward ops (``*_bwd``) and ``rl_engine::attention_decode`` have no autograd of their own
  (they are not differentiated: double backward is not offered, and decode is inference only),
  so they are called with inputs that do not require grad, and this utility only checks that
  such a call needs no autograd kernel;
* ``test_faketensor``: the fake implementation gives the real outputs' sizes, strides, dtypes and
  devices;
* ``test_aot_dispatch_dynamic``: eager and AOT-dispatched (functionalized, dynamic shapes) runs
  agree, gradients included.

No op here has an integer output, so no utility is left out for that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import shutil
from pathlib import Path

import pytest
import torch

from rl_engine import env
from rl_engine.backends.cuda_build import BuildResult, CudaLibrary
from rl_engine.backends.cuda_launch import host_emulation
from rl_engine.backends.registry import availability
from rl_engine.ops.attention.api import attention_bwd, attention_decode_op, attention_fwd
from rl_engine.ops.det_gemm.api import det_gemm_op
from rl_engine.ops.embedding.api import embedding_bwd, embedding_fwd
from rl_engine.ops.linear_logp.api import linear_logp_bwd, linear_logp_fwd
from rl_engine.ops.lm_head.api import lm_head_bwd, lm_head_fwd
from rl_engine.ops.logp.api import logp_rows_bwd, logp_rows_fwd
from rl_engine.ops.pack.api import pack_op, unpack_op
from rl_engine.ops.rms_norm.api import (add_rms_norm_bwd, add_rms_norm_fwd, norm_rope_bwd, norm_rope_fwd,
                                        rms_norm_bwd, rms_norm_fwd)
from rl_engine.ops.rope.api import rope_rotate
from rl_engine.ops.silu.api import silu_bwd, silu_fwd
from rl_engine.ops.swiglu.api import swiglu_bwd, swiglu_fwd
from rl_engine.ops._torch_op import check_device
from rl_engine.ops.spec import make_generator, standard_normal

TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")

Call = tuple[str, Any, tuple[Any, ...]]
"""(id, torch op, args)."""


def _bf16(shape, seed, device, grad=False):
    t = standard_normal(tuple(shape), make_generator(seed)).to(torch.bfloat16).to(device)
    return t.requires_grad_(grad)


def _f32(shape, seed, device, grad=False):
    return standard_normal(tuple(shape), make_generator(seed)).to(device).requires_grad_(grad)


def _detached(*ts):
    return tuple(t.detach() for t in ts)


def _rms_norm(b, dev) -> list[Call]:
    x, w = _bf16((3, 160), 1, dev, True), _bf16((160,), 2, dev, True)
    with torch.no_grad():
        y, rstd = rms_norm_fwd(x, w, 1e-6, True, 0, b)
    dy = _bf16(y.shape, 3, dev)
    return [("fwd", rms_norm_fwd, (x, w, 1e-6, True, 0, b)),
            ("fwd-fused", rms_norm_fwd, (x, w, 1e-6, False, 0, b)),
            ("bwd", rms_norm_bwd, (*_detached(x, w), dy, rstd, True, True, b)),
            ("bwd-dx-only", rms_norm_bwd, (*_detached(x, w), dy, rstd, True, False, b)),
            *_add_rms_norm(b, dev)]


def _add_rms_norm(b, dev) -> list[Call]:
    """The residual add fused into the norm (training form): forward, backward with and without
    the residual gradient."""
    x, d, w = _bf16((3, 160), 11, dev, True), _bf16((3, 160), 12, dev, True), _bf16((160,), 13, dev, True)
    with torch.no_grad():
        s, y, rstd = add_rms_norm_fwd(x, d, w, 1e-6, True, b)
    ds, dy = _bf16(s.shape, 14, dev), _bf16(y.shape, 15, dev)
    return [("add-fwd", add_rms_norm_fwd, (x, d, w, 1e-6, True, b)),
            ("add-bwd", add_rms_norm_bwd, (s, w.detach(), dy, rstd, ds, True, True, b)),
            ("add-bwd-no-residual", add_rms_norm_bwd, (s, w.detach(), dy, rstd, None, True, True, b))]


def _qk_norm(b, dev) -> list[Call]:
    """qk_norm runs the RMSNorm torch ops on the rows of [T, H, D]; a strided head view included."""
    x, w = _bf16((3, 4, 32), 4, dev, True), _bf16((32,), 5, dev, True)
    xs = _bf16((3, 8, 32), 6, dev)[:, ::2].requires_grad_(True)
    with torch.no_grad():
        _, rstd = rms_norm_fwd(x, w, 1e-6, True, 0, b)
    cos, sin = _f32((3, 16), 18, dev), _f32((3, 16), 19, dev)
    with torch.no_grad():
        _, rstd_r = norm_rope_fwd(x, w, cos, sin, 1e-6, True, b)
    return [("fwd", rms_norm_fwd, (x, w, 1e-6, True, 0, b)),
            ("fwd-strided-heads", rms_norm_fwd, (xs, w, 1e-6, True, 0, b)),
            ("bwd", rms_norm_bwd, (*_detached(x, w), _bf16(x.shape, 7, dev), rstd, True, True, b)),
            # the training form fused with RoPE (qk_norm_rope_kernel)
            ("rope-fwd", norm_rope_fwd, (x, w, cos, sin, 1e-6, True, b)),
            ("rope-bwd", norm_rope_bwd, (*_detached(x, w), _bf16(x.shape, 20, dev), rstd_r, cos, sin, True, True, b))]


def _silu(b, dev) -> list[Call]:
    x = _bf16((3, 70), 8, dev, True)
    return [("fwd", silu_fwd, (x, b)), ("bwd", silu_bwd, (x.detach(), _bf16((3, 70), 9, dev), b))]


def _swiglu(b, dev) -> list[Call]:
    g, u = _bf16((3, 70), 10, dev, True), _bf16((3, 70), 11, dev, True)
    return [("fwd", swiglu_fwd, (g, u, b)), ("bwd", swiglu_bwd, (*_detached(g, u), _bf16((3, 70), 12, dev), b))]


def _rope(b, dev) -> list[Call]:
    x = _bf16((3, 2, 16), 13, dev, True)
    cos, sin = _f32((3, 8), 14, dev), _f32((3, 8), 15, dev)
    return [("fwd", rope_rotate, (x, cos, sin, False, b)), ("inverse", rope_rotate, (x, cos, sin, True, b))]


def _embedding(b, dev) -> list[Call]:
    ids = torch.tensor([3, 0, 3, 9], dtype=torch.int64, device=dev)
    w = _bf16((10, 24), 16, dev, True)
    return [("fwd", embedding_fwd, (ids, w, b)), ("bwd", embedding_bwd, (ids, _bf16((4, 24), 17, dev), 10, b))]


def _lm_head(b, dev) -> list[Call]:
    h, w = _bf16((3, 32), 18, dev, True), _bf16((20, 32), 19, dev, True)
    dl = _f32((3, 20), 20, dev)
    return [("fwd", lm_head_fwd, (h, w, b)),
            ("bwd", lm_head_bwd, (*_detached(h, w), dl, True, True, b)),
            ("bwd-dweight-only", lm_head_bwd, (*_detached(h, w), dl, False, True, b))]


def _det_gemm(b, dev) -> list[Call]:
    a, w = _bf16((3, 40), 21, dev, True), _bf16((5, 40), 22, dev, True)
    return [("fwd", det_gemm_op, (a, w.t(), 2, False, b)), ("fwd-depth0", det_gemm_op, (a, w.t(), 0, False, b))]


def _logp(b, dev) -> list[Call]:
    logits = _f32((1, 3, 50), 23, dev, True)
    tgt = torch.tensor([[0, 49, 7]], dtype=torch.int64, device=dev)
    with torch.no_grad():
        _, rmax, rlog = logp_rows_fwd(logits, tgt, None, 0.7, 0, b)
    return [("fwd", logp_rows_fwd, (logits, tgt, None, 0.7, 0, b)),
            ("bwd", logp_rows_bwd, (logits.detach(), tgt, None, _f32((3,), 24, dev), rmax, rlog, 0.7, 0, b))]


def _batch_invariant_logp(b, dev) -> list[Call]:
    """batch_invariant_logp runs the logp torch ops on [B, S] rows with a mask."""
    logits = _f32((2, 3, 50), 25, dev, True)
    tgt = torch.tensor([[0, 49, -100], [5, 6, 7]], dtype=torch.int64, device=dev)
    mask = torch.tensor([[True, True, False], [True, False, True]], device=dev)
    with torch.no_grad():
        _, rmax, rlog = logp_rows_fwd(logits, tgt, mask, 1.0, 0, b)
    return [("fwd", logp_rows_fwd, (logits, tgt, mask, 1.0, 0, b)),
            ("bwd", logp_rows_bwd, (logits.detach(), tgt, mask, _f32((6,), 26, dev), rmax, rlog, 1.0, 0, b))]


def _linear_logp(b, dev) -> list[Call]:
    h, w = _bf16((3, 32), 27, dev, True), _bf16((40, 32), 28, dev, True)
    tgt = torch.tensor([0, 39, 5], dtype=torch.int64, device=dev)
    with torch.no_grad():
        _, rmax, rlog = linear_logp_fwd(h, w, tgt, 1.0, b)
    g = _f32((3,), 29, dev)
    return [("fwd", linear_logp_fwd, (h, w, tgt, 1.0, b)),
            ("bwd", linear_logp_bwd, (*_detached(h, w), tgt, g, rmax, rlog, 1.0, True, True, b))]


def _pack(b, dev) -> list[Call]:
    cu = torch.tensor([0, 2, 2, 5], dtype=torch.int32, device=dev)
    x = _bf16((3, 4, 16), 30, dev, True)
    xp = _bf16((5, 16), 31, dev, True)
    return [("pack", pack_op, (x, cu, [2, 0, 3], b)), ("unpack", unpack_op, (xp, cu, [2, 0, 3], 4, b))]


def _attention(b, dev) -> list[Call]:
    q = _bf16((5, 2, 16), 32, dev, True)
    k, v = _bf16((6, 1, 16), 33, dev, True), _bf16((6, 1, 16), 34, dev, True)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 3, 6], dtype=torch.int32, device=dev)
    with torch.no_grad():
        out, lse = attention_fwd(q, k, v, cu_q, cu_k, 0.25, 2, 3, 3, 0, b)
    kc, vc = _bf16((2, 8, 1, 16), 35, dev), _bf16((2, 8, 1, 16), 36, dev)
    seqlens = torch.tensor([3, 8], dtype=torch.int32, device=dev)
    return [("fwd", attention_fwd, (q, k, v, cu_q, cu_k, 0.25, 2, 3, 3, 0, b)),
            ("bwd", attention_bwd, (*_detached(q, k, v), out, lse, _bf16(out.shape, 37, dev), cu_q, cu_k, 0.25, 2, 3,
                                    3, b)),
            ("decode", attention_decode_op, (q.detach()[:2], kc, vc, seqlens, 0.25, b))]


CASES: dict[str, Callable[[str, torch.device], list[Call]]] = {
    "embedding": _embedding, "rope": _rope, "silu": _silu, "swiglu": _swiglu, "pack": _pack,
    "rms_norm": _rms_norm, "qk_norm": _qk_norm, "lm_head": _lm_head, "det_gemm": _det_gemm,
    "attention": _attention, "logp": _logp, "linear_logp": _linear_logp,
    "batch_invariant_logp": _batch_invariant_logp,
}


def test_every_op_has_opcheck_cases():
    from rl_engine import OPS

    assert sorted(CASES) == sorted(OPS)


def _run(op: str, backend: str, device: torch.device) -> None:
    calls = CASES[op](backend, device)
    check_device(backend, *(a for _, _, args in calls for a in args if isinstance(a, torch.Tensor)))
    failures = []
    for name, torch_op, args in calls:
        result = torch.library.opcheck(torch_op, args, test_utils=TEST_UTILS, raise_exception=False)
        bad = {u: r for u, r in result.items() if r != "SUCCESS"}
        assert set(result) == set(TEST_UTILS), f"{op}/{name}: opcheck ran {sorted(result)}"
        if bad:
            failures.append(f"{op}/{name} ({torch_op._name if hasattr(torch_op, '_name') else torch_op}): {bad}")
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("op", sorted(CASES))
def test_opcheck_triton(op, device):
    ok, why = availability("triton_cuda_bf16")
    if not ok:
        pytest.skip(f"triton_cuda_bf16 cannot run here: {why}")
    _run(op, "triton_cuda_bf16", device)


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(CASES))
def test_opcheck_cuda(op):
    ok, why = availability("cuda_bf16")
    if not ok:
        pytest.skip(f"cuda_bf16 cannot run here: {why}")
    _run(op, "cuda_bf16", torch.device("cuda"))


@pytest.fixture(scope="module")
def emulated_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: cuda_bf16 runs for real in test_opcheck_cuda")
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH: the host emulation of the CUDA sources cannot be built")
    import sys

    tests_dir = str(Path(__file__).resolve().parents[1])
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from cuda_emu.build import build

    try:
        path = build(env.cache_dir() / "cuda_emu")
    except FileNotFoundError as exc:
        pytest.skip(f"host emulation unavailable: {exc}")
    return CudaLibrary(BuildResult(path, "host-emulation", True, 0.0))


@pytest.mark.parametrize("op", sorted(CASES))
def test_opcheck_cuda_host_emulation(op, emulated_cuda):
    with host_emulation(emulated_cuda):
        _run(op, "cuda_bf16", torch.device("cpu"))
