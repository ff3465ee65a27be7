"""Load, validate and query the tolerance contract (``ws1-c1-v8``).

The JSON file is validated against its JSON Schema; a malformed file raises
:class:`~rl_engine.errors.ContractError` naming the offending field (for example
``forward_accuracy/reduction/bfloat16/atol: -1 is less than the minimum of 0``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from rl_engine.constants import OPS
from rl_engine.errors import ContractError

CONTRACT_VERSION = "ws1-c1-v8"
_HERE = Path(__file__).resolve().parent
DIRECTIONS = ("forward", "gradient")
OP_CLASSES = ("elementwise", "reduction", "attention", "logprob")


def default_contract_path() -> Path:
    """Path of the contract shipped with the package."""
    return _HERE / f"{CONTRACT_VERSION}.json"


def schema_path() -> Path:
    """Path of the contract's JSON Schema."""
    return _HERE / f"{CONTRACT_VERSION}.schema.json"


@dataclass(frozen=True)
class Tolerance:
    """An element-wise accuracy tolerance: ``abs(c - r) <= atol + rtol * abs(r)``."""

    atol: float
    rtol: float
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "source": self.source}


@dataclass(frozen=True)
class GradNormThresholds:
    """The gradient-normalisation thresholds of one op class (``gradient_normalisation``)."""

    op_class: str
    rel_peak: float
    rms_ratio: float


@dataclass(frozen=True)
class ChainThresholds:
    """What the chain-parity comparator needs from the contract for one profile: each metric's
    threshold, decision (``gate`` or ``monitor``) and status, the clip interval of ``clipfrac0``,
    whether dlogp must be exactly zero (``strict``), and the lhs/rhs roles."""

    profile: str
    metrics: dict[str, dict[str, Any]]
    clip_interval: tuple[float, float]
    dlogp_exactly_zero: bool
    roles: dict[str, str]

    def metric(self, name: str) -> dict[str, Any]:
        try:
            return self.metrics[name]
        except KeyError as exc:
            raise ContractError(f"chain/metrics/{name}: not in the contract") from exc


@dataclass(frozen=True)
class CrossBackend:
    """What the ``cross_backend`` judgment needs from the contract (section ``cross_backend``).

    ``backends``: the pair whose bits must agree; ``anchor``: the one the other is compared with;
    ``declared``: the ops whose arithmetic the contract declares identical on both (judged green or
    red); ``not_declared``: the others, each with the reason (judged n/a, measured anyway);
    ``chain_declared``/``chain_reason``: the same for the cross-backend chain cell."""

    backends: tuple[str, str]
    anchor: str
    declared: tuple[str, ...]
    not_declared: dict[str, str]
    chain_declared: bool
    chain_reason: str

    @property
    def other(self) -> str:
        return next(b for b in self.backends if b != self.anchor)

    def reason_not_declared(self, op: str) -> str | None:
        """None when ``op`` (or ``"chain"``) is declared bit-exact, else why not."""
        if op == "chain":
            return None if self.chain_declared else self.chain_reason
        return None if op in self.declared else self.not_declared[op]


def _field(path: Any) -> str:
    parts = [str(p) for p in path]
    return "/".join(parts) if parts else "<root>"


class Contract:
    """A validated contract. Every threshold query goes through one of these methods."""

    def __init__(self, data: dict[str, Any], path: Path, sha256: str):
        self.data = data
        self.path = path
        self.sha256 = sha256

    # -- identity -----------------------------------------------------------------------------
    @property
    def version(self) -> str:
        return str(self.data["contract_version"])

    def identity(self) -> dict[str, str]:
        """Version, file path and SHA-256, as recorded in evidence."""
        return {"contract_version": self.version, "path": str(self.path), "sha256": self.sha256}

    # -- op classes ---------------------------------------------------------------------------
    def op_class(self, op: str) -> str:
        for cls, members in self.data["op_classes"].items():
            if op in members:
                return cls
        raise ContractError(f"op_classes: op {op!r} is not assigned to any class")

    # -- accuracy -----------------------------------------------------------------------------
    def tolerance(self, direction: str, op_class: str, dtype: str = "bfloat16") -> Tolerance:
        """Element-wise tolerance of §5 for ``direction`` in {forward, gradient}."""
        if direction not in DIRECTIONS:
            raise ContractError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        table = f"{direction}_accuracy"
        try:
            row = self.data[table][op_class][dtype]
        except KeyError as exc:
            raise ContractError(f"{table}/{op_class}/{dtype}: not in the contract") from exc
        return Tolerance(float(row["atol"]), float(row["rtol"]), f"{self.version}:{table}/{op_class}/{dtype}")

    def relative_factor(self, direction: str, op: str | None = None) -> float:
        """k of the relative criterion: candidate error <= k x torch_bf16 error.

        An op's declared exception may carry its own factor (det_gemm: tree_depth + 1 forward).
        """
        key = {"forward": "forward_factor", "gradient": "backward_factor"}.get(direction)
        if key is None:
            raise ContractError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        exception = self.data["declared_exceptions"].get(op or "", {})
        own = exception.get(f"relative_criterion_{direction}_factor") if isinstance(exception, dict) else None
        return float(own) if own is not None else float(self.data["relative_criterion"][key])

    def grad_norm_threshold(self, metric: str, op_class: str) -> float:
        """Threshold of a gradient normalisation metric (``rel_peak`` or ``rms_ratio``)."""
        try:
            return float(self.data["gradient_normalisation"][metric]["thresholds"][op_class])
        except KeyError as exc:
            raise ContractError(f"gradient_normalisation/{metric}/thresholds/{op_class}: not in the contract") from exc

    def grad_norm_thresholds(self, op_class: str) -> GradNormThresholds:
        """Both gradient-normalisation thresholds of ``op_class``, for the comparator."""
        return GradNormThresholds(op_class, self.grad_norm_threshold("rel_peak", op_class),
                                  self.grad_norm_threshold("rms_ratio", op_class))

    # -- invariance ---------------------------------------------------------------------------
    @property
    def nan_policy(self) -> str:
        return str(self.data["invariance"]["nan_policy"])

    # -- chain --------------------------------------------------------------------------------
    def chain_metric(self, name: str) -> dict[str, Any]:
        try:
            return dict(self.data["chain"]["metrics"][name])
        except KeyError as exc:
            raise ContractError(f"chain/metrics/{name}: not in the contract") from exc

    def chain_metric_names(self) -> list[str]:
        return list(self.data["chain"]["metrics"])

    @property
    def clip_interval(self) -> tuple[float, float]:
        lo, hi = self.data["chain"]["clip_interval"]["value"]
        return float(lo), float(hi)

    def chain_profile(self, name: str) -> dict[str, Any]:
        profiles = self.data["chain"]["profiles"]
        if name not in profiles:
            raise ContractError(f"chain/profiles: unknown profile {name!r}; known: {sorted(profiles)}")
        return dict(profiles[name])

    def chain_thresholds(self, profile: str = "ws1") -> ChainThresholds:
        """Everything :func:`rl_engine.gate.compare.chain_metrics` judges ``profile`` by.

        Raises ContractError for an unknown profile."""
        prof = self.chain_profile(profile)
        return ChainThresholds(profile, {name: self.chain_metric(name) for name in self.chain_metric_names()},
                               self.clip_interval, bool(prof.get("dlogp_exactly_zero")),
                               dict(self.data["chain"]["roles"]["train_infer_logprob_parity"]))

    # -- FP contraction (precision_flags) ---------------------------------------------------------
    @property
    def triton_fp_fusion(self) -> bool:
        """``enable_fp_fusion`` of every Triton launch (``precision_flags.triton_enable_fp_fusion``)."""
        return bool(self.data["precision_flags"]["triton_enable_fp_fusion"])

    @property
    def nvcc_fmad(self) -> bool:
        """Whether nvcc may contract multiplies and adds (``precision_flags.nvcc_fmad``)."""
        return bool(self.data["precision_flags"]["nvcc_fmad"])

    # -- declared exceptions ------------------------------------------------------------------
    @property
    def det_gemm(self) -> dict[str, Any]:
        return dict(self.data["declared_exceptions"]["det_gemm"])

    @property
    def rms_norm_order(self) -> str:
        return str(self.data["declared_exceptions"]["rms_norm_rounding_order"]["order"])

    @property
    def logits_dtype(self) -> str:
        return str(self.data["declared_exceptions"]["logits_for_scoring"]["dtype"])

    # -- cross-backend bits -----------------------------------------------------------------------
    @property
    def cross_backend(self) -> CrossBackend:
        """The ``cross_backend`` section: the backend pair, the anchor and the declared ops."""
        cb = self.data["cross_backend"]
        return CrossBackend(tuple(cb["backends"]), str(cb["anchor_backend"]), tuple(cb["declared_bit_exact"]),
                            dict(cb["not_declared"]), bool(cb["chain"]["declared_bit_exact"]), str(cb["chain"]["reason"]))

    # -- backends -----------------------------------------------------------------------------
    def check_backend_profile(self, name: str) -> dict[str, Any]:
        """The profile of a backend; out-of-scope targets (FP8, ROCm, Ascend) raise ContractError."""
        profiles = self.data["backend_profiles"]
        out = profiles["out_of_scope"]
        lowered = name.lower()
        for key, why in out.items():
            if key in lowered:
                raise ContractError(f"backend {name!r} is out of scope: {why}")
        if name in profiles and name != "out_of_scope":
            return dict(profiles[name])
        raise ContractError(
            f"backend_profiles: no profile {name!r}; profiles: {sorted(k for k in profiles if k != 'out_of_scope')}"
        )

    def required_backends(self) -> list[str]:
        return [k for k, v in self.data["backend_profiles"].items() if k != "out_of_scope" and v.get("required")]


def _semantic_checks(data: dict[str, Any]) -> None:
    """Checks a JSON Schema cannot express, each naming the field."""
    log = data.get("changelog") or []
    if log and (log[0].get("version") != data["contract_version"] or log[0].get("from") != data["supersedes"]):
        raise ContractError(f"supersedes: {data['supersedes']!r} with contract_version {data['contract_version']!r}, "
                            f"but the newest changelog entry is {log[0].get('version')!r} from {log[0].get('from')!r}")
    seen: dict[str, str] = {}
    for cls, members in data["op_classes"].items():
        if cls not in OP_CLASSES:
            raise ContractError(f"op_classes/{cls}: unknown class; classes are {OP_CLASSES}")
        for op in members:
            if op not in OPS:
                raise ContractError(f"op_classes/{cls}: unknown op {op!r}")
            if op in seen:
                raise ContractError(f"op_classes/{cls}: op {op!r} is already in class {seen[op]!r}")
            seen[op] = cls
    missing = [op for op in OPS if op not in seen]
    if missing:
        raise ContractError(f"op_classes: required ops without a class: {missing}")
    cb = data["cross_backend"]
    declared, undeclared = list(cb["declared_bit_exact"]), list(cb["not_declared"])
    for op in declared + undeclared:
        if op not in OPS:
            raise ContractError(f"cross_backend: unknown op {op!r}")
    both = sorted(set(declared) & set(undeclared))
    if both:
        raise ContractError(f"cross_backend/not_declared: {both} are also in declared_bit_exact")
    unlisted = [op for op in OPS if op not in declared and op not in undeclared]
    if unlisted:
        raise ContractError(f"cross_backend: ops in neither declared_bit_exact nor not_declared: {unlisted}")
    for b in cb["backends"]:
        if b not in data["backend_profiles"] or b == "out_of_scope":
            raise ContractError(f"cross_backend/backends: {b!r} has no backend profile")
    if cb["anchor_backend"] not in cb["backends"]:
        raise ContractError(f"cross_backend/anchor_backend: {cb['anchor_backend']!r} is not one of backends {cb['backends']}")
    if cb["chain"]["declared_bit_exact"] and undeclared:
        raise ContractError(f"cross_backend/chain/declared_bit_exact: the chain cannot be bit-exact across backends "
                            f"while {undeclared} are not declared")
    lo, hi = data["chain"]["clip_interval"]["value"]
    if not lo < 1.0 < hi:
        raise ContractError(f"chain/clip_interval/value: must satisfy lo < 1 < hi, got [{lo}, {hi}]")
    depth = data["declared_exceptions"]["det_gemm"]["tree_depth"]
    factor = data["declared_exceptions"]["det_gemm"].get("relative_criterion_forward_factor")
    if factor is not None and factor != depth + 1:
        raise ContractError(
            f"declared_exceptions/det_gemm/relative_criterion_forward_factor: {factor} must equal tree_depth + 1 = {depth + 1}"
        )
    for s in data["declared_exceptions"]["det_gemm"]["supported_splits"]:
        if s & (s - 1) or s > 2**depth:
            raise ContractError(
                f"declared_exceptions/det_gemm/supported_splits: {s} is not a power of two <= 2^tree_depth"
            )


def _reject_constant(name: str):
    raise ContractError(f"{name} is not allowed in a contract (thresholds are finite numbers)")


def parse_contract(text: str, path: Path) -> Contract:
    """Validate contract text; raise ContractError naming the field on any problem."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ContractError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    schema = json.loads(schema_path().read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ContractError(f"{path}: {_field(first.absolute_path)}: {first.message}{more}")
    _semantic_checks(data)
    return Contract(data, path, hashlib.sha256(text.encode()).hexdigest())


@functools.lru_cache(maxsize=8)
def _load_cached(path: str) -> Contract:
    p = Path(path)
    if p.is_dir():
        raise ContractError(f"{p} is a directory, not a contract file")
    if not p.is_file():
        raise ContractError(f"contract file not found: {p}")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"{p}: not UTF-8 text (byte {exc.start}): not a contract file") from exc
    return parse_contract(text, p)


def load_contract(path: str | Path | None = None) -> Contract:
    """Load and validate a contract (default: the ``ws1-c1-v8`` file shipped with the package).

    Raises
    ------
    ContractError
        The file is missing, is not JSON, or breaks the schema (the message names the field).
    """
    if path is None:  # the shipped contract: one object per process, found without touching the file system again
        if not _DEFAULT:
            _DEFAULT.append(_load_cached(str(default_contract_path())))
        return _DEFAULT[0]
    return _load_cached(str(Path(path).resolve()))


_DEFAULT: list[Contract] = []
