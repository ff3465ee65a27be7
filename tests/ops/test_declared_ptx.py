"""The declared arithmetic in the instructions each backend compiles to, read from sm_90 PTX on the
CPU (no GPU needed): the declared log-sum-exp (``rl_engine/ops/logp/declared.py``) and the attention
forward's declared form (``attention_tc.cu`` against the Triton forward with ``ROW_SUM_PINNED``).

The host tests of the sequences (``test_cuda_backend.py::test_declared_lse_gives_the_same_bits_on_both_backends``,
``test_cuda_backend.py::test_declared_attention_forward_gives_the_triton_bits``) compare the
Triton interpreter with the host emulation of the CUDA sources, where ``/`` is IEEE on both sides,
one model stands for every exp and every MMA is an FMA chain: they cannot see that Triton's ``/`` is
the approximate ``div.full.f32``, that CUDA's ``expf`` is another function than ``tl.exp``, or which
MMA instruction a kernel runs. This file checks those choices where they are made, in the PTX: in
the declared kernels every exponential is ``ex2.approx.f32`` (``tl.exp``; CUDA's ``expf`` compiles to
a range reduction and ``ex2.approx.ftz.f32``), every division is ``div.rn.f32``, the log is libdevice
``logf`` (its constants), and the attention's MMAs are the Triton kernel's wgmma shapes and operand
sources. Each check has a control that must fail it: the kernels of the backends' own sequences.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rl_engine.backends import cuda_build

LOGF_CONSTANTS = ("3E1039F6", "BE055027", "BDF8CDCC", "3E0F2955", "BE2AD8B9", "3E4CED0B", "BE7FFF22", "3EAAAA78",
                  "3F317218")
"""The single-precision constants of libdevice ``__nv_logf``'s polynomial and ``ln 2`` (the same in
Triton 3.6's, 3.9's and CUDA 13's libdevice)."""


def declared_problems(ptx: str, *, has_log: bool) -> list[str]:
    """What in one kernel's PTX breaks the declared arithmetic (empty when nothing does)."""
    out = []
    ex2 = set(re.findall(r"\bex2\.approx[.a-z0-9]*", ptx))
    if ex2 != {"ex2.approx.f32"}:
        out.append(f"exponentials {sorted(ex2)} (declared: ex2.approx.f32 of x * log2 e only)")
    if "0f3FB8AA3B" not in ptx:
        out.append("no multiply by log2 e (0f3FB8AA3B)")
    divs = set(re.findall(r"\bdiv\.[a-z]+\.f32", ptx))
    if divs - {"div.rn.f32"}:
        out.append(f"divisions {sorted(divs)} (declared: div.rn.f32 only)")
    if has_log:
        missing = [c for c in LOGF_CONSTANTS if f"0f{c}" not in ptx]
        if missing:
            out.append(f"libdevice logf constants missing: {missing}")
    return out


# ------------------------------------------------------------------------------------------ Triton
_CASE_COMPILE = """
import sys
sys.path.insert(0, sys.argv[1])
from triton_sum_order import compile_cases

sys.stdout.write(compile_cases([sys.argv[2]]).get(sys.argv[2], ""))
"""


def _case_ptx(case: str) -> str:
    """sm_90 PTX of one kernel case of ``tests/ops/test_sm90_compile.py`` (child process)."""
    pytest.importorskip("triton")
    tools = Path(__file__).resolve().parents[2] / "tools"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _CASE_COMPILE, str(tools), case], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0 or not proc.stdout:
        pytest.skip(f"Triton cannot compile {case} for sm_90 here: {proc.stderr[-300:]}")
    return proc.stdout


@pytest.mark.parametrize("kernel", ["linear_logp_fwd_partial[True,256,declared]", "linear_logp_dlogits[True,declared]"])
def test_triton_linear_logp_declared_kernels_compile_to_the_declared_instructions(kernel):
    assert not declared_problems(_case_ptx(kernel), has_log=False)
    # control: without DIV_RN the logits tile divides with div.full.f32
    own = declared_problems(_case_ptx(kernel.replace(",declared", "")), has_log=False)
    assert any("div.full.f32" in p for p in own), own


@pytest.mark.parametrize("kernel", ["logp_fwd", "logp_bwd"])
def test_triton_declared_kernels_compile_to_the_declared_instructions(kernel):
    ptx = _case_ptx(f"{kernel}_declared[True]")
    assert not declared_problems(ptx, has_log=kernel == "logp_fwd")
    # control: Triton's own sequence divides with div.full.f32, which the check must name
    own = declared_problems(_case_ptx(f"{kernel}[True]"), has_log=kernel == "logp_fwd")
    assert any("div.full.f32" in p for p in own), own


# -------------------------------------------------------------------------------------------- CUDA
def _cuda_entries(source: str = "logprob.cu") -> dict[str, str]:
    """sm_90a PTX of one CUDA source with the library's own flags, per kernel entry (mangled name -> body)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    src = cuda_build.SOURCE_DIR / source
    flags = [f for f in cuda_build.NVCC_FLAGS if not f.startswith("-gencode")]
    proc = subprocess.run([nvcc, *flags, "-arch=sm_90a", "-ptx", "-o", "-", str(src)], capture_output=True, text=True,
                          cwd=src.parent, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a body runs to the next entry (inline asm braces make "}" at a line's start no end marker)
    starts = list(re.finditer(r"\.entry\s+(\S+?)\(", proc.stdout))
    ends = [m.start() for m in starts[1:]] + [len(proc.stdout)]
    return {m.group(1): proc.stdout[m.end():end] for m, end in zip(starts, ends)}


def _entry(entries: dict[str, str], fragment: str) -> str:
    found = [body for name, body in entries.items() if fragment in name]
    assert len(found) == 1, f"{fragment}: {len(found)} kernels ({sorted(entries)})"
    return found[0]


def test_cuda_declared_kernels_compile_to_the_declared_instructions():
    entries = _cuda_entries()
    assert not declared_problems(_entry(entries, "lpd_fwd_kernel"), has_log=True)
    assert not declared_problems(_entry(entries, "lp_bwd_kernelILb1E"), has_log=False)
    for vec2 in ("ILb0E", "ILb1E"):  # scalar and 8-byte loads of the logits
        assert not declared_problems(_entry(entries, "lpt_partial_kernel" + vec2), has_log=False)
    assert not declared_problems(_entry(entries, "lpt_finish_kernel"), has_log=True)
    # control: the chunked sequence's backward calls expf (ex2.approx.ftz.f32 after a range reduction)
    own = declared_problems(_entry(entries, "lp_bwd_kernelILb0E"), has_log=False)
    assert any("ex2.approx.ftz.f32" in p for p in own), own


# ---------------------------------------------------------------- attention, the declared forward form
def _mma_shapes(ptx: str) -> dict[str, int]:
    """``{"m64nNk16 SS|RS": count}`` of the wgmma instructions in ``ptx`` (RS: A from registers)."""
    out: dict[str, int] = {}
    for m in re.finditer(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.f32\.bf16\.bf16\s+\{[^}]*\},\s*(\{|%)", ptx):
        key = f"{m.group(1)} {'RS' if m.group(2) == '{' else 'SS'}"
        out[key] = out.get(key, 0) + 1
    return out


def attention_problems(ptx: str, *, has_log: bool) -> list[str]:
    """What in an attention forward kernel's PTX breaks the declared sequence besides
    :func:`declared_problems`: maxima other than ``max.f32`` (Triton's ``tl.max``, which returns the
    non-NaN operand), no ``cvt.rn.bf16x2.f32`` for P, no Triton NaN constant (0x7FC00000)."""
    out = declared_problems(ptx, has_log=has_log)
    maxes = set(re.findall(r"\bmax\.[a-zA-Z0-9.]*f32", ptx))
    if maxes != {"max.f32"}:
        out.append(f"maxima {sorted(maxes)} (declared: max.f32)")
    if "cvt.rn.bf16x2.f32" not in ptx:
        out.append("P is not rounded with cvt.rn.bf16x2.f32")
    if "0f7FC00000" not in ptx:
        out.append("no NaN constant 0x7FC00000")
    return out


def test_declared_attention_forward_compiles_to_the_triton_instructions():
    """attention_tc.cu's kernels at D = 128: S on wgmma m64n64k16 from shared memory (D / 16 = 8 per
    KV block), P V on wgmma m64n128k16 with P from registers (4 per block), the MMA kinds the
    Triton forward with ROW_SUM_PINNED compiles to (its PTX has a plain and a masked copy of the
    loop, and in the masked one the absent-value count as a second P V-shaped product); the declared
    exp, division, log and maxima in both. Control: the CUDA-core forward calls expf."""
    entries = _cuda_entries("attention_tc.cu")
    for kernel, has_log in (("attn_fwd_tc_kernelILi128E", True), ("attn_decode_tc_kernelILi128E", False)):
        ptx = _entry(entries, kernel)
        assert not attention_problems(ptx, has_log=has_log), (kernel, attention_problems(ptx, has_log=has_log))
        assert _mma_shapes(ptx) == {"m64n64k16 SS": 8, "m64n128k16 RS": 4}, (kernel, _mma_shapes(ptx))
    triton = _case_ptx("attention_fwd[pinned]")
    assert not attention_problems(triton, has_log=True), attention_problems(triton, has_log=True)
    assert set(_mma_shapes(triton)) == {"m64n64k16 SS", "m64n128k16 RS"}, _mma_shapes(triton)
    own = declared_problems(_entry(_cuda_entries("attention.cu"), "attn_fwd_kernelILi128E"), has_log=True)
    assert any("ex2.approx.ftz.f32" in p for p in own), own


def test_declared_attention_backward_compiles_to_the_triton_instructions():
    """attention_tc.cu's declared backward at D = 128: per KV block (dQ) or query block (dK / dV),
    S and dP on wgmma m64n64k16 from shared memory (2 x 8), and the BF16-rounded P / dS products on
    wgmma m64n128k16 from registers (dQ: 4, dK / dV: 2 x 4): the MMA kinds of the Triton backward's dQ
    and dK / dV kernels; tl.exp as ex2.approx.f32 and no approximate division on both. Control: the
    backward's own tensor-core form (mma.sync, expf)."""
    entries = _cuda_entries("attention_tc.cu")
    dq, dkdv = _entry(entries, "attn_bwd_dq_declared_kernelILi128E"), _entry(entries, "attn_bwd_dkdv_declared_kernelILi128E")
    assert _mma_shapes(dq) == {"m64n64k16 SS": 16, "m64n128k16 RS": 4}, _mma_shapes(dq)
    assert _mma_shapes(dkdv) == {"m64n64k16 SS": 16, "m64n128k16 RS": 8}, _mma_shapes(dkdv)
    for case, ptx in (("dq", dq), ("dkdv", dkdv), ("triton dq", _case_ptx("attention_bwd_dq")),
                      ("triton dkdv", _case_ptx("attention_bwd_dkdv"))):
        assert not declared_problems(ptx, has_log=False), (case, declared_problems(ptx, has_log=False))
        if case.startswith("triton"):
            assert set(_mma_shapes(ptx)) == {"m64n64k16 SS", "m64n128k16 RS"}, (case, _mma_shapes(ptx))
    own = _entry(_cuda_entries("attention_bwd.cu"), "attn_bwd_dq_tc_kernelILi128E")
    assert "mma.sync.aligned.m16n8k16" in own and not _mma_shapes(own)
    assert any("ex2.approx.ftz.f32" in p for p in declared_problems(own, has_log=False))
