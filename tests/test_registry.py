"""The one backend registry: one frozen type for built-in and external backends, availability
probed once per process, loud failures on unknown or unavailable names."""

from __future__ import annotations

import dataclasses

import pytest

import rl_engine
from rl_engine.backends import registry
from rl_engine.backends.registry import (BACKENDS, Backend, check_backend, get_backend, plugin_backend,
                                         register_backend, resolve_impl, unregister_backend)
from rl_engine.errors import BackendUnavailable, ContractError, RLEngineError
from rl_engine.ops.registry import get_spec


@pytest.fixture
def cleanup():
    names: list[str] = []
    yield names
    for n in names:
        unregister_backend(n)


def test_builtin_and_external_backends_are_one_frozen_type(cleanup):
    cleanup.append("one_type")
    ext = register_backend("one_type", {"silu": get_spec("silu").impls["torch_bf16"]}, backward=True)
    for b in (get_backend("torch_bf16"), get_backend("triton_cuda_bf16"), ext):
        assert type(b) is Backend
        with pytest.raises(dataclasses.FrozenInstanceError):
            b.name = "renamed"
    assert get_backend("torch_bf16").builtin and not ext.builtin and ext.origin == "python"
    assert ext.backward == frozenset({"silu"}) and ext.batch_invariant == frozenset()
    with pytest.raises(TypeError):
        ext.ops["rms_norm"] = ext.ops["silu"]  # the op table cannot change behind the registry's back


def test_availability_is_probed_once_per_backend(cleanup):
    calls = []

    def probe():
        calls.append(1)
        return False, "probe says no"

    cleanup.append("probed")
    register_backend("probed", {"silu": get_spec("silu").impls["torch_bf16"]}, available=probe)
    for _ in range(3):
        with pytest.raises(BackendUnavailable, match="probe says no"):
            resolve_impl("silu", "probed")
    assert registry.availability("probed") == (False, "probe says no")
    assert len(calls) == 1


def test_resolve_impl_does_not_probe_again_for_a_builtin():
    backend = get_backend("torch_bf16")
    check_backend("torch_bf16")  # answered and cached
    probe = backend.probe

    def no_probe():
        raise AssertionError("the availability probe ran on an op call")

    object.__setattr__(backend, "probe", no_probe)  # a frozen dataclass: swapped behind its back, for the test
    try:
        for _ in range(3):
            assert resolve_impl("silu", "torch_bf16") is get_spec("silu").impls["torch_bf16"]
    finally:
        object.__setattr__(backend, "probe", probe)


def test_unknown_name_lists_every_valid_one(cleanup):
    cleanup.append("listed_plugin")
    register_backend("listed_plugin", {"silu": get_spec("silu").impls["torch_bf16"]})
    with pytest.raises(RLEngineError, match="unknown backend 'nonsense'") as info:
        check_backend("nonsense")
    for name in (*BACKENDS, "listed_plugin", "hf_transformers", "liger"):
        assert name in str(info.value)


def test_out_of_scope_names_say_so_given_the_contract(contract):
    with pytest.raises(ContractError, match="out of scope"):
        check_backend("triton_fp8", contract)
    with pytest.raises(RLEngineError, match="unknown backend"):  # without the contract: unknown, still loud
        check_backend("triton_fp8")


def test_a_missing_op_is_named(cleanup):
    cleanup.append("silu_only")
    register_backend("silu_only", {"silu": get_spec("silu").impls["torch_bf16"]})
    with pytest.raises(BackendUnavailable, match="silu_only does not provide rms_norm"):
        resolve_impl("rms_norm", "silu_only")
    assert get_backend("silu_only").provides("silu") and not get_backend("silu_only").provides("rms_norm")


def test_builtin_impls_come_from_the_op_rooms():
    for op in ("silu", "rms_norm", "attention"):
        assert get_backend("reference_fp32").impl(op) is get_spec(op).impls["reference_fp32"]
    from rl_engine.ops.attention.spec import DECODE_IMPLS

    assert get_backend("torch_bf16").impl("attention_decode") is DECODE_IMPLS["torch_bf16"]


def test_bad_registrations_are_refused():
    silu = get_spec("silu").impls["torch_bf16"]
    with pytest.raises(RLEngineError, match="unknown op"):
        plugin_backend("x", {"softmax": silu})
    with pytest.raises(RLEngineError, match="built-in"):
        rl_engine.register_backend("cuda_bf16", {"silu": silu})
    with pytest.raises(RLEngineError, match="provides no op"):
        plugin_backend("x", {})
    with pytest.raises(RLEngineError, match="batch_invariant names ops it does not provide"):
        plugin_backend("x", {"silu": silu}, batch_invariant=["rope"])
    with pytest.raises(RLEngineError, match="origin"):
        Backend("x", origin="somewhere")


def test_a_missing_adapter_library_is_a_backend_that_cannot_run():
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        ok, why = registry.availability("liger")
        assert not ok and "liger-kernel" in why
        with pytest.raises(BackendUnavailable, match="liger-kernel"):
            check_backend("liger")
    else:  # pragma: no cover - a machine with liger installed
        pytest.skip("liger-kernel is installed here; the missing-library path cannot be shown")
