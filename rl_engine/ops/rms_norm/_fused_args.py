"""The launcher-level checks of the norm backward's fused extras, shared by both backends'
``rms_norm_bwd`` (the op layer checks its inputs before it calls them; these guard direct calls)."""

from __future__ import annotations

import torch


def check_fused_bwd_args(x: torch.Tensor, residual_grad: torch.Tensor | None,
                         rope: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """``residual_grad``: None or like x [T, E] (2-D rows only) with unit stride on E; ``rope``:
    None or (cos, sin) FP32 [T, D/2] with unit stride on the last axis for [T, H, D] rows (D even).

    Raises
    ------
    ValueError
        Either extra of another shape, stride or dtype, or for rows of the other rank.
    """
    if residual_grad is not None and (x.dim() != 2 or tuple(residual_grad.shape) != tuple(x.shape)
                                      or residual_grad.stride(-1) != 1):
        raise ValueError(f"rms_norm_bwd: residual_grad must be like x [T, E] with unit stride on E, got "
                         f"{list(residual_grad.shape)} for x {list(x.shape)}")
    if rope is not None:
        t, d = x.shape[0], x.shape[-1]
        if x.dim() != 3 or d % 2 or any(tuple(a.shape) != (t, d // 2) or a.stride(-1) != 1
                                        or a.dtype != torch.float32 for a in rope):
            raise ValueError(f"rms_norm_bwd: rope tables must be FP32 [T, D/2] with unit stride for [T, H, D] rows, "
                             f"got {[list(a.shape) for a in rope]} for x {list(x.shape)}")
