"""The multi-core FP64 normal draw gives the bits and the final generator state of one torch.randn."""

from __future__ import annotations

import pytest
import torch

from rl_engine.ops import _draw


def _single(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(torch.float32), g


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 64 values and 3 workers, so that chunking and threads run on small draws."""
    monkeypatch.setattr(_draw, "CHUNK", 64)
    monkeypatch.setattr(_draw, "_workers", lambda: 3)


# remainders mod 16 of 0, 1, 15, 17 (merged into the last chunk), and a rest of 16..63
@pytest.mark.parametrize("n", [128, 129, 143, 64 * 5 + 15, 64 * 4 + 17, 64 * 7 + 40, 64 * 3 + 16])
def test_chunked_draw_equals_one_draw(small_chunks, n):
    want, g_want = _single((n,), 11)
    g = torch.Generator().manual_seed(11)
    got = _draw.normal_fp64_as_fp32((n,), g)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    # the generator continues exactly where the single draw left it
    assert torch.equal(torch.randn(40, generator=g, dtype=torch.float64),
                       torch.randn(40, generator=g_want, dtype=torch.float64))


def test_shape_is_kept(small_chunks):
    want, _ = _single((9, 31), 3)
    got = _draw.normal_fp64_as_fp32((9, 31), torch.Generator().manual_seed(3))
    assert got.shape == (9, 31) and got.dtype == torch.float32
    assert torch.equal(got, want)


def test_chunk_sizes_keep_blocks_whole(small_chunks):
    for n in range(128, 400):
        sizes = _draw.chunk_sizes(n)
        assert sum(sizes) == n
        assert all(s % 16 == 0 for s in sizes[:-1]) and sizes[-1] >= 16


def test_negative_control_a_split_off_the_block_grid_changes_values():
    """Chunks of 40 (not a multiple of 16) break PyTorch's 16-value Box-Muller blocks: the values
    differ, so the equality above is a real check."""
    n = 120
    want, _ = _single((n,), 5)
    g = torch.Generator().manual_seed(5)
    parts = [torch.randn(40, generator=g, dtype=torch.float64) for _ in range(3)]
    naive = torch.cat(parts).to(torch.float32)
    assert not torch.equal(naive, want)


def test_large_draw_uses_threads_and_matches():
    """At the real chunk size (2 M values), on however many cores this host has."""
    n = 2 * _draw.CHUNK + 16 * 3 + 7
    want, g_want = _single((n,), 1)
    g = torch.Generator().manual_seed(1)
    got = _draw.normal_fp64_as_fp32((n,), g)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(g.get_state(), g_want.get_state())
