"""The fixed-order sums that the Triton kernels use where ``tl.sum``'s order would be the compiler's
(``rl_engine/ops/_triton_common.py``; docs/declared-arithmetic.md, "Sums whose order is the Triton
compiler's"). In the interpreter, as on the GPU, each step sums an axis of size 2: one IEEE addition
of two defined operands. Each check runs on rows with a cancelling 2^24 pair, where orders differ,
and a control (the left fold Triton 3.6 compiles ``tl.sum`` to) must differ on them.
"""

from __future__ import annotations

import pytest
import torch

from _helpers import bits_equal, cancelling_rows
from rl_engine.ops._triton_common import fragment_row_sum


def _declared_fragment_row_sum(p: torch.Tensor) -> torch.Tensor:
    """Row sums of ``p`` [M, N] FP32 as fragment_row_sum declares them: one addition per pair over the
    column index's bits 0, then 3, 4, ... up to the highest, then 2, 1 (each step one IEEE addition;
    the partial sum of a pair stays at the column whose bit is 0)."""
    n = p.shape[1]
    bits = n.bit_length() - 1
    y = p.clone()
    cols = torch.arange(n)
    for b in [0, *range(3, bits), 2, 1]:
        cols = cols[(cols >> b) & 1 == 0]
        y[:, cols] = y[:, cols] + y[:, cols + (1 << b)]
    return y[:, 0]


@pytest.mark.parametrize(("n", "seed", "step"), [(8, 14, 11), (16, 22, 11), (64, 70, 11), (64, 5, 7), (128, 134, 11)])
def test_fragment_row_sum_adds_in_the_declared_order(n, seed, step):
    """fragment_row_sum gives the declared pairwise order's bits on rows where the order shows (a
    cancelling 2^24 pair among small values), at the attention's 64 keys, linear_logp's 128 columns
    and the tests' other KV blocks. Control: a left fold (Triton 3.6's ``tl.sum`` order per thread
    on sm_90) differs on them."""
    import triton
    import triton.language as tl

    @triton.jit
    def row_sum_kernel(p_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr):
        rows = tl.arange(0, M)
        cols = tl.arange(0, N)
        p = tl.load(p_ptr + rows[:, None] * N + cols[None, :])
        tl.store(out_ptr + rows, fragment_row_sum(p))

    p = cancelling_rows(16, n, seed=seed, step=step)
    out = torch.empty(16, dtype=torch.float32)
    row_sum_kernel[(1,)](p, out, M=16, N=n)
    expected = _declared_fragment_row_sum(p)
    assert bits_equal(out, expected), f"fragment_row_sum vs the declared order (N = {n})"
    fold = p[:, 0].clone()
    for j in range(1, n):
        fold = fold + p[:, j]
    assert not bits_equal(fold, expected), "the rows do not tell the orders apart: the check could not fail"


def test_the_model_is_the_64_key_order_written_out():
    """The general model above, at 64 columns, is the attention's declared key order written out by
    hand: key bits 0, 3, 4, 5, then 2, 1, one addition per pair."""
    p = cancelling_rows(16, 64, seed=5, step=7)
    x = p.reshape(16, 2, 2, 2, 2, 2, 2)  # (M, b5, b4, b3, b2, b1, b0)
    for axis in (6, 3, 2, 1, 1, 1):  # b0, b3, b4, b5, b2, b1
        x = x.select(axis, 0) + x.select(axis, 1)
    assert bits_equal(_declared_fragment_row_sum(p), x)
