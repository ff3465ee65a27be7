"""Pieces shared by the Triton kernels of every op.

The one rule for matrix products: every ``tl.dot`` in the package goes through :func:`mma`, which
passes ``input_precision="ieee"`` explicitly, so no FP32 dot can silently run in TF32 (WS1 §9.7,
``docs/pitfalls.md`` P6). Under the Triton CPU interpreter BF16 dots are not supported
(triton-lang/triton#11584), so the operands are upcast to FP32 first; BF16 x BF16 products are
exact in FP32, only the accumulation order can differ from the GPU's tensor cores. The
interpreter's own dot, exp/log and BF16 rounding are replaced by project-defined arithmetic on
the first launch (:mod:`rl_engine.ops._interpreter`), so CPU bits do not depend on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from rl_engine import env
from rl_engine.ops import _interpreter
from rl_engine.errors import BackendUnavailable


FP_FUSION = False
"""``enable_fp_fusion`` passed to every Triton launch of the package: the contract's
``precision_flags.triton_enable_fp_fusion`` (``ws1-c1-v4``). Triton's default (``True``) lets the
compiler turn ``a*b - c*d`` into ``fma(a, b, -(c*d))``, a function the declared per-op FP32 math
does not compute. ``rl-engine audit`` checks that every launch passes this constant and that it
equals the contract."""


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr):
    """Return ``acc + a @ b`` with an FP32 accumulator and IEEE input precision."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision="ieee")


@triton.jit
def exp_ieee(x):
    """FP32 ``exp`` as the CUDA math library's ``expf`` computes it (libdevice ``__nv_expf``), the
    declared exp of the elementwise ops; ``tl.exp`` is ``ex2.approx.f32(x * log2 e)`` on the GPU,
    which differed from ``expf`` in 30 % of 50 M inputs on the H200 (tools/probe_elementwise.py)."""
    return libdevice.exp(x)


@triton.jit
def div_ieee(a, b):
    """IEEE FP32 division (``div.rn.f32``); Triton's ``/`` is ``div.full.f32``, approximate."""
    return tl.math.div_rn(a, b)


@triton.jit
def row_sum_fixed(lanes, LANES: tl.constexpr):
    """Sum of ``lanes`` [LANES] (LANES = 128, four groups of 32) in the declared fixed order:
    within each group of 32, ``v[j] + v[j + 16]``, then ``+ 8``, ``+ 4``, ``+ 2``, ``+ 1`` (the
    CUDA backend's ``__shfl_xor`` butterfly); then the four group sums as ``(s0 + s1) + (s2 + s3)``.
    Every step sums an axis of size 2, i.e. exactly one IEEE addition, so the order is the
    program's, not the compiler's layout (``docs/declared-arithmetic.md``)."""
    tl.static_assert(LANES == 128, "row_sum_fixed is declared for 128 lanes")
    x = tl.sum(tl.reshape(lanes, (4, 2, 16)), axis=1)
    x = tl.sum(tl.reshape(x, (4, 2, 8)), axis=1)
    x = tl.sum(tl.reshape(x, (4, 2, 4)), axis=1)
    x = tl.sum(tl.reshape(x, (4, 2, 2)), axis=1)
    x = tl.sum(tl.reshape(x, (4, 2, 1)), axis=1)
    x = tl.sum(tl.reshape(x, (2, 2)), axis=1)
    x = tl.sum(tl.reshape(x, (1, 2)), axis=1)
    return tl.sum(x, axis=0)


@triton.jit
def row_sum_fixed_rows(lanes, R: tl.constexpr, LANES: tl.constexpr):
    """:func:`row_sum_fixed` of each row of ``lanes`` [R, LANES] -> [R]: the same steps along the
    last axis (each an axis of size 2, one IEEE addition), so row ``i``'s sum has the bits of
    ``row_sum_fixed(lanes[i])`` whatever R is."""
    tl.static_assert(LANES == 128, "row_sum_fixed is declared for 128 lanes")
    x = tl.sum(tl.reshape(lanes, (R, 4, 2, 16)), axis=2)
    x = tl.sum(tl.reshape(x, (R, 4, 2, 8)), axis=2)
    x = tl.sum(tl.reshape(x, (R, 4, 2, 4)), axis=2)
    x = tl.sum(tl.reshape(x, (R, 4, 2, 2)), axis=2)
    x = tl.sum(tl.reshape(x, (R, 4, 2, 1)), axis=2)
    x = tl.sum(tl.reshape(x, (R, 2, 2)), axis=2)
    x = tl.sum(tl.reshape(x, (R, 1, 2)), axis=2)
    return tl.sum(x, axis=1)


@triton.jit
def divide(x, y, IEEE: tl.constexpr):
    """``x / y`` as the declared sequences divide (``IEEE``: ``tl.math.div_rn``, ``div.rn.f32``), else
    as Triton's ``/`` (``div.full.f32``, approximate: up to 2 ulp)."""
    if IEEE:
        return tl.math.div_rn(x, y)
    else:
        return x / y


@triton.jit
def fragment_row_sum(p):
    """Row sums of ``p`` [M, N] (N a power of two >= 8) in a fixed order: one addition per step, over
    the column index's bits 0, then 3, 4, ... (up to the highest), then 2, 1. In an MMA accumulator
    (wgmma m64nN, mma.sync m16n8) a thread holds columns ``8 j + 2 t`` and ``+ 1`` of its rows, so
    bits 0 and 3 and up are its own values (a pairwise tree in fragment order) and bits 2, 1 the quad
    butterfly with offsets 2, 1: the order in which Triton 3.9 adds such a row with ``tl.sum`` (3.6
    folds each thread's values left to right). N = 64 is the attention's row sum,
    N = 128 the linear_logp forward's. Each step sums an axis of size 2, so the order is the
    program's whatever the compiler's layout or version."""
    M: tl.constexpr = p.shape[0]
    N: tl.constexpr = p.shape[1]
    tl.static_assert(N >= 8 and N <= 256, "fragment_row_sum is declared for 8 to 256 columns")
    x = tl.sum(tl.reshape(p, (M, N // 8, 2, 2, 2)), axis=4)  # bit 0 -> (M, j, b2, b1)
    for i in tl.static_range(5):  # bits 3, 4, ...: the lowest remaining bit of j, while j has one
        if N >= (16 << i):
            x = tl.sum(tl.reshape(x, (M, N >> (i + 4), 2, 2, 2)), axis=2)
    x = tl.reshape(x, (M, 2, 2))
    x = tl.sum(x, axis=1)  # bit 2 -> (M, b1)
    return tl.sum(x, axis=1)  # bit 1


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for grids and block counts on the host, in plain Python. ``triton.cdiv`` and
    ``triton.next_power_of_2`` are ``constexpr_function`` objects in recent Triton (3.9: about 2.6 us
    per host call, unwrapping their arguments), and the launchers call them about fifty times per
    layer of a training forward; same values (``tests/ops/test_host_helpers.py``)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (``triton.next_power_of_2``'s value; 0 for 0), plain Python."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def upcast_dots() -> bool:
    """True under the interpreter: BF16 ``tl.dot`` operands are upcast to FP32 (see module doc)."""
    return env.triton_interpret()


_GPU_FACTS: dict[int, tuple[int, int]] = {}


def gpu_facts(device: torch.device) -> tuple[int, int]:
    """(compute capability major, SM count) of a CUDA device, read once per device (the launcher asks on
    every call)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _GPU_FACTS:
        props = torch.cuda.get_device_properties(idx)
        _GPU_FACTS[idx] = (props.major, props.multi_processor_count)
    return _GPU_FACTS[idx]


def tma_layout(t: torch.Tensor) -> bool | None:
    """How a 2-D BF16 operand can be read by TMA: False (unit stride on the last dim), True (unit
    stride on the first dim: the descriptor holds the transpose), None (neither, or a base or a row
    pitch that is not 16-byte aligned)."""
    if t.data_ptr() % 16:
        return None
    for transposed, unit, pitch in ((False, 1, 0), (True, 0, 1)):
        if t.stride(unit) == 1 and (t.stride(pitch) * t.element_size()) % 16 == 0 and t.stride(pitch) >= t.shape[unit]:
            return transposed
    return None


_READY: set[tuple[torch.device, bool]] = set()
"""(device, interpreter on) pairs already checked by :func:`check_triton_device`."""


def check_triton_device(*tensors: torch.Tensor) -> None:
    """Triton kernels need CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.

    Checked once per (device, interpreter setting) and cached, so the op path pays one set
    lookup per tensor after the first call (the interpreter's arithmetic is installed then)."""
    interpret = env.triton_interpret()
    for t in tensors:
        key = (t.device, interpret)
        if key in _READY:
            continue
        if t.device.type == "cuda":
            _READY.add(key)
            continue
        if t.device.type == "cpu" and interpret:
            _interpreter.install()
            _READY.add(key)
            continue
        if t.device.type == "cpu":
            raise BackendUnavailable(
                "triton_cuda_bf16 needs CUDA tensors; CPU tensors run only under TRITON_INTERPRET=1"
            )
        raise BackendUnavailable(f"triton_cuda_bf16 cannot run on device {t.device}")


if env.triton_interpret():
    # installed at import too, not only by check_triton_device: a launcher called directly (a test,
    # a tool) before any op entry point must not run on the interpreter's host-BLAS dot
    _interpreter.install()
