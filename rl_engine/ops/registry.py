"""Find the spec of an op by name. Specs are imported on first use, never at package import."""

from __future__ import annotations

import importlib

from rl_engine.constants import OPS
from rl_engine.errors import RLEngineError
from rl_engine.ops.spec import OpSpec


def get_spec(op: str) -> OpSpec:
    """The :class:`OpSpec` of ``op``; unknown names raise with the list of valid ones."""
    if op not in OPS:
        raise RLEngineError(f"unknown op {op!r}; valid: {', '.join(OPS)}")
    module = importlib.import_module(f"rl_engine.ops.{op}.spec")
    spec = module.SPEC
    if spec.name != op:
        raise RLEngineError(f"rl_engine.ops.{op}.spec.SPEC is named {spec.name!r}")
    return spec


def all_specs() -> list[OpSpec]:
    return [get_spec(op) for op in OPS]
