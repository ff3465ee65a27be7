"""Masked means absent (docs/declared-semantics.md) on a CUDA GPU at Qwen3-8B-like shapes
(32 query heads, 8 KV heads, head dim 128, a few hundred to ~4k tokens), for both kernel backends
and for the FP32 reference on the GPU; plus finite inputs give the same bits as the Triton kernels
of commit 7892be7 (read from git history, tests/ops/_legacy.py, launched with fusion off as the
contract now declares) on the GPU.

The checks are those of tests/ops/_masked.py (the CPU file runs them small, under the Triton
interpreter and the CUDA host emulation). Marked ``gpu``: skipped without CUDA.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager

import pytest
import torch

from _masked import (POISONS, Shape, assert_same_bits, check_blind_queries, check_decode_past_length,
                     check_future_keys, check_logp_mask, check_other_sequences, check_pack_padding,
                     check_prefill_rows_equal_decode)

pytestmark = pytest.mark.gpu

QWEN3_8B = Shape(heads=32, kv_heads=8, head_dim=128)
PREFILL = ((4133,), (4133,))
CHUNKED = ((300, 1, 129), (2817, 700, 1000))
BLIND = ((1000,), (1000,))
VARLEN = (517, 0, 2048, 33, 1500)
DECODE_LENS = (1, 300, 2817, 4133, 0, 64)
S_MAX = 4200
BACKENDS = ["triton_cuda_bf16", "cuda_bf16", "reference_fp32"]
POISON_IDS = list(POISONS)


@pytest.fixture(scope="module")
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")


def _impls(backend):
    """(varlen impl, decode impl, input dtype)."""
    if backend == "triton_cuda_bf16":
        from rl_engine.ops.attention.api import attention_decode_triton, attention_triton

        return attention_triton, attention_decode_triton, torch.bfloat16
    if backend in ("cuda_bf16", "cuda_bf16_fma_bwd"):
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip(f"cuda_bf16 is built for sm_90a; this GPU is {torch.cuda.get_device_capability()}")
        if shutil.which("nvcc") is None:
            pytest.skip("nvcc is not on PATH: the CUDA library cannot be built")
        from rl_engine.ops.attention.api import attention_cuda, attention_decode_cuda

        return attention_cuda, attention_decode_cuda, torch.bfloat16
    from rl_engine.ops.attention.reference import attention_decode_reference, attention_reference

    return attention_reference, attention_decode_reference, torch.float32


@contextmanager
def _bwd_form(backend):
    """``cuda_bf16_fma_bwd``: cuda_bf16 with its attention backward in the tensor-core form."""
    if backend != "cuda_bf16_fma_bwd":
        yield
        return
    from rl_engine.ops.attention import cuda as attn_cuda

    old = attn_cuda.set_bwd_form("fma")
    try:
        yield
    finally:
        assert attn_cuda.set_bwd_form(old) == "fma"


BWD_BACKENDS = BACKENDS + ["cuda_bf16_fma_bwd"]


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", BWD_BACKENDS)
def test_gpu_prefill_future_keys_absent(backend, poison, gpu):
    impl, _, dtype = _impls(backend)
    with _bwd_form(backend):
        check_future_keys(impl, QWEN3_8B, *PREFILL, POISONS[poison], dtype=dtype, device=gpu)


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", BWD_BACKENDS)
def test_gpu_chunked_prefill_future_keys_absent(backend, poison, gpu):
    impl, _, dtype = _impls(backend)
    with _bwd_form(backend):
        check_future_keys(impl, QWEN3_8B, *CHUNKED, POISONS[poison], dtype=dtype, device=gpu)


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", BWD_BACKENDS)
def test_gpu_backward_blind_queries_absent(backend, poison, gpu):
    impl, _, dtype = _impls(backend)
    with _bwd_form(backend):
        check_blind_queries(impl, QWEN3_8B, *BLIND, POISONS[poison], dtype=dtype, device=gpu)
        check_blind_queries(impl, QWEN3_8B, *CHUNKED, POISONS[poison], dtype=dtype, device=gpu)


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", BWD_BACKENDS)
def test_gpu_varlen_other_sequences_absent(backend, poison, gpu):
    impl, _, dtype = _impls(backend)
    with _bwd_form(backend):
        check_other_sequences(impl, QWEN3_8B, VARLEN, 2, POISONS[poison], dtype=dtype, device=gpu)
        check_other_sequences(impl, QWEN3_8B, VARLEN, 4, POISONS[poison], dtype=dtype, device=gpu)


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_decode_past_length_absent(backend, poison, gpu):
    _, impl, dtype = _impls(backend)
    check_decode_past_length(impl, QWEN3_8B, DECODE_LENS, S_MAX, POISONS[poison], dtype=dtype, device=gpu)


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "cuda_bf16"])
def test_gpu_issue17_prefill_row_equals_decode_step_with_nan_in_future(backend, poison, gpu):
    varlen, decode, _ = _impls(backend)
    check_prefill_rows_equal_decode(varlen, decode, QWEN3_8B, 2817, POISONS[poison], device=gpu,
                                    queries=(0, 1, 63, 64, 1000, 2752, 2790, 2815))


@pytest.fixture(scope="module")
def legacy_triton(tmp_path_factory):
    from _legacy import legacy_attention_triton

    return legacy_attention_triton(tmp_path_factory.mktemp("legacy_triton"))


@pytest.mark.parametrize("lens", [PREFILL, CHUNKED, (VARLEN, VARLEN)], ids=["prefill-4133", "chunked", "varlen"])
def test_gpu_finite_inputs_same_bits_as_old_triton_kernels(lens, gpu, legacy_triton, monkeypatch):
    """The split loops and masked-tile path change no bit on finite inputs on the H200 (with the old
    kernels' ``tl.sum``: ROW_SUM_PINNED's sums are another declared order)."""
    from rl_engine.ops.attention import triton as attn_triton
    from rl_engine.ops.attention.api import attention_decode_triton, attention_triton

    monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", False)

    g = torch.Generator().manual_seed(21)
    h, hkv, d = QWEN3_8B.heads, QWEN3_8B.kv_heads, QWEN3_8B.head_dim
    lq, lk = lens
    mk = lambda *s: torch.randn(s, generator=g).to(torch.bfloat16).to(gpu)  # noqa: E731
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=gpu)  # noqa: E731
    q, k, v, do = mk(sum(lq), h, d), mk(sum(lk), hkv, d), mk(sum(lk), hkv, d), mk(sum(lq), h, d)
    res = []
    for fn in (attention_triton, legacy_triton.attention_triton):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = fn(qq, kk, vv, cu(lq), cu(lk), d ** -0.5)
        out.backward(do)
        res.append((out.detach(), qq.grad, kk.grad, vv.grad))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *res):
        assert_same_bits(a, b, f"{name} new vs 7892be7")
    qd = mk(len(DECODE_LENS), h, d)
    kc, vc = mk(len(DECODE_LENS), S_MAX, hkv, d), mk(len(DECODE_LENS), S_MAX, hkv, d)
    sl = torch.tensor(DECODE_LENS, dtype=torch.int32, device=gpu)
    with torch.no_grad():
        assert_same_bits(attention_decode_triton(qd, kc, vc, sl, d ** -0.5),
                         legacy_triton.attention_decode_triton(qd, kc, vc, sl, d ** -0.5), "decode new vs 7892be7")


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "cuda_bf16"])
def test_gpu_batch_invariant_logp_masked_rows_absent(backend, poison, gpu):
    _impls(backend)  # skips cuda_bf16 where it cannot run
    if backend == "triton_cuda_bf16":
        from rl_engine.ops.batch_invariant_logp.api import batch_invariant_logp_triton as impl
    else:
        from rl_engine.ops.batch_invariant_logp.api import batch_invariant_logp_cuda as impl
    check_logp_mask(impl, POISONS[poison], device=gpu, shape=(2, 33, 151936))


@pytest.mark.parametrize("poison", POISON_IDS)
@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "cuda_bf16"])
def test_gpu_pack_padding_absent(backend, poison, gpu):
    _impls(backend)
    if backend == "triton_cuda_bf16":
        from rl_engine.ops.pack.api import pack_triton as p, unpack_triton as u
    else:
        from rl_engine.ops.pack.api import pack_cuda as p, unpack_cuda as u
    check_pack_padding(p, u, torch.bfloat16, POISONS[poison], device=gpu)
