"""Host-side grid arithmetic: the plain-Python ``cdiv`` / ``next_power_of_2`` of
``rl_engine.ops._triton_common`` give Triton's values, and no launcher calls Triton's own (a
``constexpr_function`` in recent Triton, ~2.6 us per host call; ~50 calls per layer of a training
forward)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import triton

from rl_engine.ops._triton_common import cdiv, next_power_of_2

ROOT = Path(__file__).resolve().parents[2] / "rl_engine"
TRITON_HOST_CALL = re.compile(r"\btriton\.(cdiv|next_power_of_2)\(")


@pytest.mark.parametrize("b", [1, 2, 3, 16, 64, 128, 1000])
def test_cdiv_is_tritons(b):
    for a in [0, 1, 2, 15, 16, 17, 63, 64, 65, 4095, 4096, 4097, 151936, 2**31 + 5]:
        assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_next_power_of_2_is_tritons():
    for n in [*range(0, 300), 4095, 4096, 4097, 151936, 2**31 - 1, 2**31]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def _host_calls(text: str) -> list[str]:
    return [m.group(0) for m in TRITON_HOST_CALL.finditer(text)]


def test_no_launcher_calls_tritons_constexpr_helpers():
    found = {str(p.relative_to(ROOT)): calls for p in sorted(ROOT.rglob("*.py"))
             if (calls := _host_calls(p.read_text()))}
    assert not found, f"host calls of triton.cdiv / triton.next_power_of_2 (use _triton_common's): {found}"


def test_negative_control_the_scan_sees_a_planted_call():
    assert _host_calls("grid = (triton.cdiv(n, BLOCK),)\nb = triton.next_power_of_2(e)") == \
        ["triton.cdiv(", "triton.next_power_of_2("]
