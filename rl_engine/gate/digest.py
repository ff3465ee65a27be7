"""A digest of the raw bits a judgment looked at, so two runs can be compared bit for bit.

Evidence keeps summaries, never raw tensors; :class:`BitsDigest` lets ``rl-engine diff --same-bits``
still say whether two runs (two hosts, two BLAS settings, two commits) produced the same bits in
every judged output. Per tensor it computes, on the tensor's own device, two position-weighted
checksums of the raw bit patterns modulo the primes 2**31 - 1 and 2**31 - 19 in exact int64
arithmetic (no overflow, so the result does not depend on the reduction order), and folds them
with the tensor's path, dtype and shape into a SHA-256. A change of one element's bits changes
both checksums unless the change is a multiple of both primes, which a 32-bit pattern cannot be.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch

_MODULI = ((2147483647, 1_000_003), (2147483629, 7_919_131))
_CHUNK = 1 << 24
_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as non-negative int64, flattened (bool/ints/floats alike)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.to(torch.int64)
    width = flat.element_size()
    if width not in _BIT_VIEWS:
        raise TypeError(f"cannot digest a tensor of dtype {t.dtype}")
    bits = flat.view(_BIT_VIEWS[width]).to(torch.int64)
    if width < 8:
        bits = bits & ((1 << (8 * width)) - 1)
    return bits


def tensor_checksums(t: torch.Tensor) -> tuple[int, int]:
    """The two modular position-weighted checksums of ``t``'s raw bits (see module doc).

    The per-chunk sums stay on the tensor's device (each is below 2**24 * 2**31 = 2**55, and the
    running total is reduced mod the prime after every chunk, so int64 never overflows); the host
    reads the two totals once.
    """
    bits = _raw_bits(t)
    n = bits.numel()
    totals = []
    for prime, gen in _MODULI:
        total = torch.zeros((), dtype=torch.int64, device=bits.device)
        for start in range(0, n, _CHUNK):
            b = bits[start:start + _CHUNK] % prime
            idx = torch.arange(start, start + b.numel(), device=b.device, dtype=torch.int64)
            w = (idx % prime * gen + 1) % prime  # < 2**31, never 0 mod prime for these sizes
            total = (total + ((b * w) % prime).sum()) % prime
        totals.append(total)
    c1, c2 = torch.stack(totals).tolist()
    return int(c1), int(c2)


class BitsDigest:
    """Accumulates ``(path, tensor)`` pairs in order; :meth:`hexdigest` is the combined digest."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.count = 0

    def add(self, path: str, t: torch.Tensor) -> None:
        c1, c2 = tensor_checksums(t)
        self._sha.update(f"{path}|{t.dtype}|{tuple(t.shape)}|{c1}|{c2};".encode())
        self.count += 1

    def add_all(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        for path, t in items:
            self.add(path, t)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()[:32]
