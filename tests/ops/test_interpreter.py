"""The CPU interpreter's arithmetic is the project's, not the host's (docs/cpu-interpreter.md).

The witness of the fault: OpenBLAS's Haswell SGEMM gives a row of ``A @ B`` a different result
depending on the row's position in ``A``, and the Triton interpreter's ``tl.dot`` was ``np.matmul``.
CI runs this file under several BLAS core types and thread counts (``.ci/run``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from rl_engine.audit import scan
from rl_engine.ops import _interpreter
from rl_engine.ops._triton_common import FP_FUSION, check_triton_device, mma

ROOT = Path(__file__).resolve().parents[2]
BM, BK, BN = 64, 64, 32


@triton.jit
def _block_dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr):
    rm, rk, rn = tl.arange(0, BM), tl.arange(0, BK), tl.arange(0, BN)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    c = mma(a, b, tl.zeros((BM, BN), dtype=tl.float32), False)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], c)


def _kernel_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty((BM, BN), dtype=torch.float32, device=a.device)
    check_triton_device(a, b, c)
    _block_dot_kernel[(1,)](a, b, c, BM=BM, BK=BK, BN=BN, enable_fp_fusion=FP_FUSION)
    return c


def _operands(device, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(11)
    a = torch.randn((BM, BK), generator=g, dtype=torch.float64).to(dtype).to(device)
    b = torch.randn((BK, BN), generator=g, dtype=torch.float64).to(dtype).to(device)
    return a, b


def _rows_moved(dot, a, b) -> list[int]:
    """For every shift s, how many rows of ``dot(roll(a, s))`` rolled back differ from ``dot(a)``."""
    ref = dot(a, b)
    moved = []
    for s in range(1, BM):
        out = torch.roll(dot(torch.roll(a, s, 0), b), -s, 0)
        moved.append(int((out.view(torch.int32) != ref.view(torch.int32)).any(dim=1).sum()))
    return moved


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_a_row_gets_the_same_bits_at_every_position_of_the_block(device, dtype):
    a, b = _operands(device, dtype)
    moved = _rows_moved(_kernel_dot, a, b)
    assert moved == [0] * (BM - 1), f"rows whose bits depend on their position, per shift: {moved}"


def test_position_check_catches_a_position_dependent_dot(device):
    """Negative control: a dot whose summation order depends on the row index must be caught."""

    def rowwise_order(a, b):
        prods = a.float()[:, :, None] * b.float()[None, :, :]
        out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32)
        for i in range(a.shape[0]):  # row i starts its sum at k = i mod K
            order = (torch.arange(BK) + i) % BK
            acc = torch.zeros(b.shape[1], dtype=torch.float32)
            for k in order:
                acc = acc + prods[i, k].cpu()
            out[i] = acc
        return out

    a, b = _operands("cpu", torch.float32)
    assert sum(_rows_moved(rowwise_order, a, b)) > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's dot is what this checks")
def test_interpreter_dot_is_the_documented_sequential_order():
    a, b = _operands("cpu", torch.bfloat16)
    got = _kernel_dot(a, b)
    acc = torch.zeros((BM, BN), dtype=torch.float32)
    af, bf = a.float(), b.float()
    for k in range(BK):
        acc = acc + af[:, k:k + 1] * bf[k:k + 1, :]
    assert torch.equal(got.view(torch.int32), acc.view(torch.int32))


def test_dot_fixed_order_adds_the_accumulator_first():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    acc = rng.standard_normal((5, 3)).astype(np.float32)
    want = acc.copy()
    for k in range(7):
        want = (want + (a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float32)).astype(np.float32)
    assert np.array_equal(_interpreter.dot_fixed_order(a, b, acc).view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("shape", [(5, 7, 3), (32, 64, 32), (16, 64, 64), (2, 40, 64, 33)])
def test_both_dot_paths_are_the_same_chain(shape):
    """Large tiles add k by k, small ones through np.add.accumulate: the same bits (batched too)."""
    *batch, m, k, n = shape
    rng = np.random.default_rng(sum(shape))
    a = (rng.standard_normal((*batch, m, k)) * 3).astype(np.float32)
    b = rng.standard_normal((*batch, k, n)).astype(np.float32)
    acc = rng.standard_normal((*batch, m, n)).astype(np.float32)
    want = acc.copy()
    for j in range(k):
        want = (want + (a[..., :, j:j + 1] * b[..., j:j + 1, :]).astype(np.float32)).astype(np.float32)
    got = _interpreter.dot_fixed_order(a, b, acc)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), want.view(np.int32))
    assert np.array_equal(_interpreter._dot_k_loop(a, b, acc).view(np.int32), want.view(np.int32))
    # negative control: the textbook pairwise/BLAS sum of the same products is another function
    assert not np.array_equal((acc + a @ b).view(np.int32), want.view(np.int32))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter's patching; on a GPU tl.exp is ex2.approx")
def test_cached_builtins_are_patched_during_a_launch_and_restored_after(device):
    """The member cache keeps Triton's per-launch patch and restore: after a launch ``tl.exp`` is
    Triton's own function again, and a kernel using it still runs."""
    before = tl.exp
    x = torch.linspace(-3, 3, 64, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    _exp_kernel[(1,)](x, y, N=64, enable_fp_fusion=FP_FUSION)
    assert tl.exp is before
    assert torch.equal(y.cpu(), torch.from_numpy(_interpreter.exp_fp32(x.cpu().numpy())))


@triton.jit
def _exp_helper(x):
    return tl.exp(x) + tl.sum(x, axis=0)  # tl.sum: a helper of triton.language (it sees tl.core)


@triton.jit
def _helper_loop_kernel(x_ptr, y_ptr, N: tl.constexpr, STEPS: tl.constexpr):
    offs = tl.arange(0, N)
    acc = tl.zeros((N,), dtype=tl.float32)
    for i in range(STEPS):
        acc += _exp_helper(tl.load(x_ptr + i * N + offs))
    tl.store(y_ptr + tl.program_id(0) * N + offs, acc)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter's patching")
def test_helpers_patch_the_language_once_per_launch_not_once_per_call(device, monkeypatch):
    """Triton's interpreter patches ``tl`` / ``tl.core`` again at every ``@triton.jit`` helper call; the
    install skips the calls whose modules the launch already patched. Counted: Triton's own
    ``_patch_lang`` runs once for the launch and once for the first helper of ``triton.language``
    (``tl.zeros``, which sees ``tl.core``; every later ``tl.sum`` is skipped too), not once per call
    (3 programs x 4 steps x 2 helpers); the kernel's values are the helper's
    arithmetic, and after the launch ``tl.exp`` is Triton's own function again. Control: with the
    skip taken out (every call patched, as Triton does) the count is the per-call one."""
    from triton.runtime import interpreter as interp

    original = interp._rl_engine_original_patch_lang
    calls = []

    def counting(fn):
        calls.append(fn.__name__)
        return original(fn)

    n, steps, programs = 16, 4, 3
    x = torch.linspace(-2, 2, n * steps, dtype=torch.float32, device=device)
    x_np = x.cpu().numpy().reshape(steps, n)
    want = np.zeros(n, dtype=np.float32)
    for i in range(steps):
        want = want + (_interpreter.exp_fp32(x_np[i]) + np.float32(np.sum(x_np[i])))

    def run() -> torch.Tensor:
        y = torch.empty(programs * n, dtype=torch.float32, device=device)
        _helper_loop_kernel[(programs,)](x, y, N=n, STEPS=steps, enable_fp_fusion=FP_FUSION)
        return y.cpu().view(programs, n)

    before = tl.exp
    monkeypatch.setattr(interp, "_rl_engine_original_patch_lang", counting)
    y = run()
    skipped = list(calls)
    assert tl.exp is before
    for row in y:
        assert np.array_equal(row.numpy().view(np.int32), want.view(np.int32))
    assert skipped == ["_helper_loop_kernel", "zeros"], skipped
    # control: every call through Triton's own patch (the per-call count the skip removes)
    calls.clear()
    monkeypatch.setattr(interp, "_patch_lang", counting)
    assert torch.equal(run(), y)
    assert len(calls) >= 1 + programs * steps * 2, calls


@triton.jit
def _exp_kernel(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, tl.exp(tl.load(x_ptr + offs)))


def _fp32_sample() -> np.ndarray:
    rng = np.random.default_rng(5)
    return np.concatenate([rng.standard_normal(1 << 16) * 30, rng.uniform(-110, 90, 1 << 14)]).astype(np.float32)


@pytest.mark.parametrize("name, fn, exact", [
    ("exp", _interpreter.exp_fp32, np.exp), ("exp2", _interpreter.exp2_fp32, np.exp2),
])
def test_exp_is_the_fp64_value_rounded_once(name, fn, exact):
    x = _fp32_sample()
    with np.errstate(over="ignore", under="ignore"):
        want = exact(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(fn(x).view(np.int32), want.view(np.int32)), name


@pytest.mark.parametrize("name, fn, exact", [
    ("log", _interpreter.log_fp32, np.log), ("log2", _interpreter.log2_fp32, np.log2),
])
def test_log_is_the_fp64_value_rounded_once(name, fn, exact):
    x = np.abs(_fp32_sample()) + np.float32(1e-30)
    x = np.concatenate([x, np.array([1e-45, 1.1754942e-38, 3.4e38], dtype=np.float32)])
    want = exact(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(fn(x).view(np.int32), want.view(np.int32)), name


def test_specials():
    f32 = np.float32
    inf, nan = f32(np.inf), f32(np.nan)
    e = _interpreter.exp_fp32(np.array([0.0, -0.0, inf, -inf, nan, 89.0, -104.0], dtype=f32))
    assert e[0] == 1 and e[1] == 1 and e[2] == inf and e[3] == 0 and np.isnan(e[4]) and e[5] == inf and e[6] == 0
    lg = _interpreter.log_fp32(np.array([0.0, -0.0, 1.0, inf, -1.0, nan], dtype=f32))
    assert lg[0] == -inf and lg[1] == -inf and lg[2] == 0 and lg[3] == inf and np.isnan(lg[4]) and np.isnan(lg[5])
    powers = np.array([2.0 ** k for k in range(-149, 128, 7)], dtype=f32)
    assert np.array_equal(_interpreter.log2_fp32(powers), np.arange(-149, 128, 7, dtype=f32))


def test_bf16_bits_decode_exactly():
    x = torch.tensor([1.0, -2.5, 3.0e38, 1e-40, 0.0, -0.0], dtype=torch.bfloat16)
    got = _interpreter.bf16_bits_to_fp32(x.view(torch.int16).numpy())
    assert np.array_equal(got.view(np.int32), x.float().numpy().view(np.int32))


# The interpreter defines these; any other transcendental would come from the host's NumPy.
DEFINED_MATH = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "div_rn", "sqrt_rn"}
HOST_MATH = {"sin", "cos", "tan", "tanh", "erf", "sigmoid", "softmax", "log1p", "expm1", "pow", "fma", "cdiv_rn"}


def _math_calls(src: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            base = f.value
            if (isinstance(base, ast.Name) and base.id in ("tl", "libdevice")) or (
                    isinstance(base, ast.Attribute) and base.attr in ("math", "libdevice")):
                names.add(f.attr)
    return names


def test_kernels_use_only_math_the_interpreter_defines():
    used = set()
    for path in scan.python_files(ROOT):
        if scan.jit_kernel_names(path.read_text(), str(path)):
            used |= _math_calls(path.read_text())
    assert used & DEFINED_MATH, "the scan found no math call at all: it is looking in the wrong place"
    assert not used & HOST_MATH, f"kernels call {sorted(used & HOST_MATH)}, which the interpreter takes from the host"


def test_math_scan_catches_a_host_function():
    assert "sin" in _math_calls("import triton.language as tl\ndef k(x):\n    return tl.sin(x)\n")
    assert "tanh" in _math_calls("def k(x):\n    return tl.math.tanh(x)\n")
    assert "sin" in _math_calls("def k(x):\n    return libdevice.sin(x)\n")


def test_libdevice_exp_is_the_interpreters_exp(device):
    """The elementwise ops' exp is libdevice's on the GPU; the interpreter defines it as exp_fp32."""
    if device.type == "cuda":
        pytest.skip("on the GPU libdevice.exp is CUDA's expf")
    from rl_engine.ops.silu.api import silu_triton

    x = torch.linspace(-20, 20, 4096, dtype=torch.float64).to(torch.bfloat16).reshape(4, 1024)
    xf = x.float().numpy()
    e = _interpreter.exp_fp32(-xf)
    want = torch.from_numpy((xf / (np.float32(1.0) + e)).astype(np.float32)).to(torch.bfloat16)
    assert torch.equal(silu_triton(x).view(torch.int16), want.view(torch.int16))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's arithmetic: CPU only")
def test_a_kernel_launched_before_any_op_entry_point_gets_the_projects_arithmetic():
    """A fresh process that imports a kernel module and launches it directly (no op entry point,
    so no check_triton_device) must already run the project's interpreter arithmetic: a test
    calling det_gemm's launcher first once got the interpreter's stock ``np.matmul`` dot instead.
    The control: with the interpreter off, importing the module installs nothing."""
    import os
    import subprocess
    import sys

    code = ("from rl_engine.ops.det_gemm import triton as dg\nfrom rl_engine.ops import _interpreter\n"
            "print(_interpreter._INSTALLED)")
    runs = {}
    for flag in ("1", "0"):
        env = {**os.environ, "TRITON_INTERPRET": flag, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[flag] = out.stdout.strip().splitlines()[-1]
    assert runs == {"1": "True", "0": "False"}
