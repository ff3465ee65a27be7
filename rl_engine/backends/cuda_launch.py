"""Launch helpers shared by the ``cuda_bf16`` implementations in ``rl_engine/ops/<op>/cuda.py``.

The library is built and loaded lazily on the first launch (see :mod:`rl_engine.backends.cuda_build`).
Launchers run on the device of their tensors and on PyTorch's current stream of that device, so
they order correctly with the surrounding PyTorch work; every launcher's ``cudaError_t`` is checked
and turned into :class:`~rl_engine.backends.cuda_build.CudaKernelError` with the CUDA error string.

:func:`host_emulation` exists for the test suite only: it routes every launch to a host build of
the same sources (``tests/cuda_emu``) that runs on CPU tensors, so the kernels' index arithmetic,
reduction orders and the Python-to-C argument lists are exercised on machines without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from rl_engine.backends.cuda_build import CudaLibrary, load_library
from rl_engine.errors import BackendUnavailable

REQUIRED_CAPABILITY = (9, 0)
"""The library holds ``sm_90a`` machine code only (H100 / H200)."""

_EMULATED: list[CudaLibrary] = []


@contextlib.contextmanager
def host_emulation(lib: CudaLibrary) -> Iterator[None]:
    """TESTS ONLY: inside the block, launches go to ``lib`` (a host-emulated build of the CUDA
    sources) with CPU tensors and a null stream, and no GPU is required."""
    _EMULATED.append(lib)
    try:
        yield
    finally:
        _EMULATED.pop()


def _library() -> CudaLibrary:
    return _EMULATED[-1] if _EMULATED else load_library()


_CAPABLE: set[torch.device] = set()
"""CUDA devices already found to have compute capability 9.0 by :func:`check_cuda_device`."""


def check_cuda_device(*tensors: torch.Tensor) -> CudaLibrary:
    """Raise BackendUnavailable unless CUDA is available, every tensor is on a CUDA device of
    compute capability 9.0, and the library builds; return the loaded library.

    The capability of each device is asked once and cached (the op path calls this on every
    call; after the first it costs a set lookup per tensor)."""
    if _EMULATED:
        for t in tensors:
            if t.device.type != "cpu":
                raise BackendUnavailable(f"the host-emulated cuda_bf16 library needs CPU tensors, got {t.device}")
        return _EMULATED[-1]
    for t in tensors:
        dev = t.device
        if dev in _CAPABLE:
            continue
        if dev.type != "cuda":
            if not torch.cuda.is_available():
                raise BackendUnavailable("cuda_bf16 needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
            raise BackendUnavailable(f"cuda_bf16 needs CUDA tensors, got a tensor on {dev}")
        cap = torch.cuda.get_device_capability(dev)
        if tuple(cap) != REQUIRED_CAPABILITY:
            raise BackendUnavailable(
                f"cuda_bf16 is built for sm_90a (compute capability 9.0); {dev} has {cap[0]}.{cap[1]}"
            )
        _CAPABLE.add(dev)
    return load_library()


def launch(device: torch.device, name: str, *args: Any) -> None:
    """Call launcher ``name`` of the library on ``device`` with PyTorch's current stream appended."""
    if _EMULATED:
        _EMULATED[-1].call(name, *args, None)
        return
    lib = load_library()
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        lib.call(name, *args, stream)


def query(name: str, *args: int) -> int:
    """An ``int64_t`` value exported by the library: a kernel constant (``rl_logp_chunk_v()``) or
    a scratch size (``rl_rms_norm_dw_chunks(rows)``)."""
    return _library().query(name, *args)


def set_programmatic_launch(mode: int) -> int:
    """Set the PDL mode (programmatic dependent launch, ``cuda_src/common.cuh``) of later
    ``cuda_bf16`` launches in this process and return the previous one. 0, the library's start:
    plain launches; 1: the decode kernels (warp GEMV, add + RMSNorm, qk_norm + RoPE, SwiGLU, the
    decode attention's two launches) may start while the kernel before them finishes, waiting in
    the kernel for its results; 2: that, and the GEMV and add + RMSNorm also copy their weight
    before that wait, which is only correct where no kernel writes a weight meanwhile. The bits do
    not depend on the mode.

    A CUDA graph keeps the mode its launches were captured with. Raises ValueError for another
    mode. Under the host emulation the mode is accepted and changes nothing (launches run one
    after another there)."""
    if mode not in (0, 1, 2):
        raise ValueError(f"PDL mode must be 0, 1 or 2, got {mode!r}")
    return _library().query("rl_set_programmatic_launch", mode)


@contextlib.contextmanager
def programmatic_launch(mode: int = 2) -> Iterator[None]:
    """Launches inside the block use PDL mode ``mode`` (default 2: early weight copies, for a
    decode step, where no kernel writes a weight); the previous mode is restored on exit."""
    old = set_programmatic_launch(mode)
    try:
        yield
    finally:
        set_programmatic_launch(old)
