"""What a gate run judges: its configuration and the cells it plans, in run order.

Shared by the runner (:mod:`rl_engine.gate.runner`), which runs the cells, and the audit
(:mod:`rl_engine.audit.checks`), which checks that every required cell is planned; neither needs
the other for this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_engine.backends.registry import KERNEL_BACKENDS, availability, check_backend
from rl_engine.errors import RLEngineError
from rl_engine.ops.spec import TRANSFORMS, Workload

JUDGMENTS = ("forward_accuracy", "gradient_accuracy", "forward_invariance", "gradient_invariance", "repeat",
             "chain_parity", "cross_backend")
DEFAULT_JUDGMENTS = JUDGMENTS


@dataclass(frozen=True)
class CellKey:
    op: str
    backend: str
    judgment: str
    transform: str | None = None


@dataclass
class GateConfig:
    ops: list[str]
    backends: list[str]
    judgments: list[str]
    workload: Workload
    out_dir: Path
    seed: int = 0
    requested_backends: list[str] = field(default_factory=list)
    left_out: list[dict[str, str]] = field(default_factory=list)
    cell_timeout: float | None = None
    """Seconds a cell may run before it is marked red with reason ``timeout`` (None: no limit)."""
    resume: dict[str, Any] | None = None
    """A previous, incomplete evidence to finish (cells already there are kept, not re-run)."""
    cross_backend: str = "declared"
    """Scope of the informational cross-backend table (:data:`CROSS_BACKEND_SCOPES`); the table is
    made only in a run without the ``cross_backend`` judgment, whose cells record the same rows."""
    cross_pair: tuple[str, str] = ("triton_cuda_bf16", "cuda_bf16")
    """``(anchor, other)`` of the ``cross_backend`` judgment (the contract's ``cross_backend``
    section); its cells are planned when both are judged."""

    def cross_judged(self) -> bool:
        """Whether this run plans ``cross_backend`` cells: the judgment asked for and both backends
        of the pair judged."""
        return "cross_backend" in self.judgments and all(b in self.backends for b in self.cross_pair)


CROSS_BACKEND_SCOPES = ("declared", "all", "none")
"""``declared``: every case, forward and gradients, of the ops the contract declares identical on
both backends, the first case's forward outputs of the others; ``all``: every case, forward and
gradients, of every op (the map issue #34 needs; costs a second run of every case per backend);
``none``: no table."""


def resolve_backends(requested: str | None, contract: Any = None) -> tuple[list[str], list[dict[str, str]]]:
    """``None``/``"all"``: every kernel backend that can run here (the rest listed with reasons).
    A named backend must be able to run, else BackendUnavailable (exit 2); given the contract, a
    name it declares out of scope raises ContractError (exit 2)."""
    if requested in (None, "all"):
        judged, left = [], []
        for b in KERNEL_BACKENDS:
            ok, why = availability(b)
            (judged if ok else left).append(b if ok else {"backend": b, "reason": why})
        if not judged:
            raise RLEngineError("no kernel backend can run on this machine: "
                                + "; ".join(f"{d['backend']}: {d['reason']}" for d in left))
        return judged, left
    names = list(dict.fromkeys(n.strip() for n in requested.split(",") if n.strip()))
    if not names:
        raise RLEngineError(f"--backend {requested!r} names no backend; give a backend name or 'all'")
    for n in names:
        if n in ("reference_fp32", "torch_bf16"):
            raise RLEngineError(f"{n} is the gate's {'gold reference' if n == 'reference_fp32' else 'relative-criterion baseline'}, "
                                "not a backend it judges; judge triton_cuda_bf16, cuda_bf16 or a plugin")
        check_backend(n, contract)
    return names, []


def plan(config: GateConfig) -> list[CellKey]:
    """The cells in run order: the chain cells first (the repeat judgment's fresh processes, started
    with the run, do their work meanwhile), then op by op in the model's op order. A
    ``cross_backend`` cell is keyed by the pair's other backend (``config.cross_pair[1]``) and comes
    after both backends' cells of its op; the chain's after both chain_parity cells."""
    keys: list[CellKey] = []
    cross = config.cross_judged()
    if "chain_parity" in config.judgments:
        keys += [CellKey("chain", b, "chain_parity", None) for b in config.backends]
        if cross:
            keys.append(CellKey("chain", config.cross_pair[1], "cross_backend", None))
    for op in config.ops:
        for backend in config.backends:
            for j in config.judgments:
                if j in ("chain_parity", "cross_backend"):
                    continue
                if j == "repeat":
                    keys.append(CellKey(op, backend, j))
                    continue
                if j in ("forward_invariance", "gradient_invariance"):
                    keys += [CellKey(op, backend, j, t) for t in TRANSFORMS]
                else:
                    keys.append(CellKey(op, backend, j))
        if cross:  # after both backends' cells of the op, whose outputs it reuses
            keys.append(CellKey(op, config.cross_pair[1], "cross_backend"))
    return keys
