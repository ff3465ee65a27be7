"""fp32_reference_guard (WS1 §3.1 condition 3): TF32 and autocast off inside, state restored after."""

from __future__ import annotations

import pytest
import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, precision_readback, require_fp32
from rl_engine.ops.silu.reference import silu_reference


@pytest.fixture
def loose_precision():
    """Set every flag the guard controls to its non-reference value; restore the originals after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved[0]
    torch.backends.cudnn.allow_tf32 = saved[1]
    torch.set_float32_matmul_precision(saved[2])


def _assert_loose_state():
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.get_float32_matmul_precision() == "high"


def test_inside_the_guard_tf32_and_autocast_are_off(loose_precision):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
        with fp32_reference_guard() as readback:
            assert torch.backends.cuda.matmul.allow_tf32 is False
            assert torch.backends.cudnn.allow_tf32 is False
            assert torch.get_float32_matmul_precision() == "highest"
            assert not torch.is_autocast_enabled("cpu")
            assert not torch.is_autocast_enabled("cuda")
            assert readback == precision_readback()
            assert readback == {"cuda_matmul_allow_tf32": False, "cudnn_allow_tf32": False,
                                "float32_matmul_precision": "highest", "autocast_cpu": False, "autocast_cuda": False}
        assert torch.is_autocast_enabled("cpu"), "the outer autocast region is restored after the guard"
    _assert_loose_state()


def test_state_restored_after_normal_exit(loose_precision):
    with fp32_reference_guard():
        pass
    _assert_loose_state()


def test_state_restored_after_exception(loose_precision):
    class Boom(RuntimeError):
        pass

    with pytest.raises(Boom):
        with fp32_reference_guard():
            assert torch.backends.cuda.matmul.allow_tf32 is False
            raise Boom("inside the reference body")
    _assert_loose_state()
    assert not torch.is_autocast_enabled("cpu")


def test_nested_guards_restore(loose_precision):
    with fp32_reference_guard():
        with fp32_reference_guard():
            pass
        assert torch.backends.cuda.matmul.allow_tf32 is False
    _assert_loose_state()


def test_reference_under_outer_autocast_stays_fp32():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 24, generator=g) * 3).to(torch.bfloat16).float()
    plain = silu_reference(x)
    a = torch.randn(8, 8, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # negative control: outside the guard, CPU autocast does run a matmul in BF16
        assert torch.mm(a, a).dtype == torch.bfloat16
        with fp32_reference_guard():
            assert torch.mm(a, a).dtype == torch.float32
        y = silu_reference(x)
    assert y.dtype == torch.float32
    assert torch.equal(y.view(torch.int32), plain.view(torch.int32))


def test_require_fp32():
    require_fp32(x=torch.zeros(2), ids=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="x must be float32"):
        require_fp32(x=torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(TypeError):
        silu_reference(torch.zeros(2, 3, dtype=torch.bfloat16))
