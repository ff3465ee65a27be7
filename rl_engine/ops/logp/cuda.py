"""CUDA C++ log-probabilities of target tokens from FP32 logits (``cuda_bf16`` backend).

Kernels in ``rl_engine/backends/cuda_src/logprob.cu``. The V axis of each row is cut into fixed
chunks of ``rl_logp_chunk_v() = 4096`` entries (a constant: the cut depends on V only, never on T).
``rl_logp_partial``: one block of 256 threads per (row, chunk) runs an online FP32 max / sum-exp
of ``z = logits / temperature`` (Milakov & Gimelshein 2018): thread ``i`` visits entries ``i, i +
256, ...`` of the chunk in increasing order, then a fixed warp butterfly and the 8 warps in order.
``rl_logp_finish``: one thread per row combines the chunk pairs in chunk order and writes
``out = (z_t - m) - log(s)`` (FP32), keeping ``m`` and ``log(s)`` for the backward (``docs/pitfalls.md`` P4,
P11). ``rl_logp_bwd``: ``dlogits = (onehot * g - p * g) / temperature`` with
``p = exp((z - m) - log(s))``, FP32.

With ``declared.DECLARED_LSE`` (off by default) the forward is ``rl_logp_declared_fwd`` instead: one
block of 256 threads per row runs the declared sequence of ``logp/declared.py`` (the Triton
kernel's, tile for tile and addition for addition, ``tl.exp`` as ``ex2.approx.f32``), and the
backward ``rl_logp_declared_bwd`` computes ``p`` with that ``tl.exp``.

A row's bits depend only on that row (its logits, target, the temperature and V), so batch
invariance holds by construction. The same kernels serve ``batch_invariant_logp`` (two-level row
index with strides and a mask) and ``linear_logp`` (one logits chunk at a time), so equal logits
give equal bits on all three paths.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch, query
from rl_engine.ops.logp import declared


def chunk_v() -> int:
    """Width of the fixed V chunks of the online log-sum-exp (``LP_CHUNK_V`` in logprob.cu)."""
    return query("rl_logp_chunk_v")


def _fixed_chunks(block_v: int) -> None:
    if block_v:
        raise ValueError("the V chunk of cuda_bf16 is fixed (rl_logp_chunk_v); only the Triton negative control varies it")


def forward_rows(logits3: torch.Tensor, targets2: torch.Tensor, mask2: torch.Tensor | None,
                 temperature: float, block_v: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of validated ``logits3 [O, I, V]`` fp32, ``targets2 [O, I]``, optional ``mask2``.

    Returns (logprobs, row max, log sum-exp), each FP32 ``[O * I]``. ``block_v`` must be 0.
    """
    _fixed_chunks(block_v)
    o, i, v = logits3.shape
    rows = o * i
    dev = logits3.device
    out = torch.empty(rows, dtype=torch.float32, device=dev)
    rmax = torch.empty(rows, dtype=torch.float32, device=dev)
    rlog = torch.empty(rows, dtype=torch.float32, device=dev)
    if rows == 0:
        return out, rmax, rlog
    mask_u8 = mask2.view(torch.uint8) if mask2 is not None else None
    smo, smi = (mask2.stride(0), mask2.stride(1)) if mask2 is not None else (0, 0)
    if declared.DECLARED_LSE:
        launch(dev, "rl_logp_declared_fwd", logits3, rows, i, logits3.stride(0), logits3.stride(1), v,
               float(temperature), targets2, targets2.stride(0), targets2.stride(1), mask_u8, smo, smi, out, rmax, rlog)
        return out, rmax, rlog
    n_chunks = -(-v // chunk_v())
    part_m = torch.empty((rows, n_chunks), dtype=torch.float32, device=dev)
    part_s = torch.empty((rows, n_chunks), dtype=torch.float32, device=dev)
    part_t = torch.empty(rows, dtype=torch.float32, device=dev)
    launch(dev, "rl_logp_partial", logits3, rows, i, logits3.stride(0), logits3.stride(1), 0, v, 0, n_chunks,
           n_chunks, float(temperature), targets2, targets2.stride(0), targets2.stride(1), mask_u8, smo, smi,
           part_m, part_s, part_t)
    launch(dev, "rl_logp_finish", part_m, part_s, part_t, rows, i, n_chunks, mask_u8, smo, smi, out, rmax, rlog)
    return out, rmax, rlog


def backward_rows(logits3: torch.Tensor, targets2: torch.Tensor, mask2: torch.Tensor | None, g: torch.Tensor,
                  rmax: torch.Tensor, rlog: torch.Tensor, temperature: float, block_v: int = 0) -> torch.Tensor:
    """dlogits FP32 ``[O, I, V]`` (contiguous) of :func:`forward_rows`; zero rows where the mask is False."""
    _fixed_chunks(block_v)
    o, i, v = logits3.shape
    rows = o * i
    dx = torch.empty((o, i, v), dtype=torch.float32, device=logits3.device)
    if rows == 0 or v == 0:
        return dx
    g = g.reshape(rows).to(torch.float32).contiguous()
    mask_u8 = mask2.view(torch.uint8) if mask2 is not None else None
    smo, smi = (mask2.stride(0), mask2.stride(1)) if mask2 is not None else (0, 0)
    if declared.DECLARED_LSE:
        launch(logits3.device, "rl_logp_declared_bwd", logits3, logits3.stride(0), logits3.stride(1), dx,
               dx.stride(0), dx.stride(1), rows, i, 0, v, float(temperature), targets2, targets2.stride(0),
               targets2.stride(1), mask_u8, smo, smi, g, rmax, rlog)
        return dx
    launch(logits3.device, "rl_logp_bwd", logits3, logits3.stride(0), logits3.stride(1), dx, dx.stride(0),
           dx.stride(1), rows, i, 0, v, float(temperature), targets2, targets2.stride(0), targets2.stride(1),
           mask_u8, smo, smi, g, rmax, rlog)
    return dx
