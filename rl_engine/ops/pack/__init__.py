"""Padded <-> packed layout: :func:`pack` ([B, S, E] -> [T, E]) and its inverse :func:`unpack`.

Sequence b holds ``L_b = cu_seqlens[b+1] - cu_seqlens[b]`` valid rows at the start of ``x[b]``
(right padding); packed, they are rows ``cu_seqlens[b] .. cu_seqlens[b+1]``.
"""

from rl_engine.ops.pack.api import pack, unpack

__all__ = ["pack", "unpack"]
