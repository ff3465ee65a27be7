"""Input validation shared by every op. Called before any kernel launch.

Every check raises :class:`rl_engine.errors.InputError` with a message that names the argument,
what was expected and what was given. Nothing is cast, clamped or dropped silently.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_engine.errors import InputError


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    device: torch.device | None = None,
    contiguous_last: bool = False,
    contiguous: bool = False,
) -> torch.Tensor:
    """Check one tensor argument and return it unchanged.

    ``shape`` entries of ``None`` match any size. ``contiguous_last`` asks for a unit stride on the
    last axis (what the kernels need); ``contiguous`` asks for a fully contiguous tensor.
    """
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            want = " or ".join(str(d).replace("torch.", "") for d in allowed)
            raise InputError(f"{name}: expected dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None and t.dim() != ndim:
        raise InputError(f"{name}: expected {ndim} dimensions, got shape {list(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise InputError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise InputError(f"{name}: expected device {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise InputError(f"{name}: expected a contiguous tensor, got strides {list(t.stride())}")
    if contiguous_last and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise InputError(f"{name}: expected unit stride on the last axis, got strides {list(t.stride())}")
    return t


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device; returns it."""
    devices = {n: t.device for n, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise InputError(f"tensors must share one device, got {listing}")
    return first


def check_index_range(name: str, ids: torch.Tensor, upper: int) -> None:
    """Every id in ``[0, upper)``; otherwise name the first offending position and value (P9)."""
    if ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= upper)
    if bool(bad.any()):
        pos = int(torch.nonzero(bad.reshape(-1))[0, 0])
        val = int(ids.reshape(-1)[pos])
        raise InputError(f"{name}: id {val} at flat position {pos} is outside [0, {upper})")


def check_cu_seqlens(name: str, cu: torch.Tensor, total: int) -> list[int]:
    """``cu_seqlens`` is int32 [B+1], starts at 0, non-decreasing, ends at ``total``.

    Returns the values as a Python list (the host needs them to plan the launch).
    """
    check_tensor(name, cu, dtype=torch.int32, ndim=1)
    if cu.numel() < 1:
        raise InputError(f"{name}: expected at least one entry [B+1], got an empty tensor")
    vals = [int(v) for v in cu.tolist()]
    if vals[0] != 0:
        raise InputError(f"{name}: must start at 0, got {vals[0]}")
    for i in range(1, len(vals)):
        if vals[i] < vals[i - 1]:
            raise InputError(f"{name}: must be non-decreasing, got {vals[i - 1]} then {vals[i]} at index {i}")
    if vals[-1] != total:
        raise InputError(f"{name}: last entry {vals[-1]} does not match the {total} packed tokens")
    return vals


def check_finite(name: str, t: torch.Tensor) -> None:
    """Raise when ``t`` holds NaN or infinity (for ops whose inputs must be finite)."""
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise InputError(f"{name}: holds non-finite values (NaN or inf)")
