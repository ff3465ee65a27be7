"""Evidence artifacts: schema validation and atomic writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_engine.jsonio import schema_problem, strict_json, write_json_atomic

from rl_engine.errors import RLEngineError

SCHEMA_VERSION = "rl_engine.evidence/1"
_SCHEMA = Path(__file__).resolve().parent / "evidence.schema.json"


def _clean(obj: Any) -> Any:
    """JSON has no inf/NaN: encode them as strings so the file stays strict JSON."""
    return strict_json(obj)


def validate(evidence: dict[str, Any]) -> None:
    """Raise RLEngineError naming the first field that breaks the evidence schema."""
    problem = schema_problem(json.loads(_SCHEMA.read_text()), evidence)
    if problem:
        raise RLEngineError(f"evidence does not match its schema {problem}")


def write_atomic(path: Path, evidence: dict[str, Any]) -> None:
    """Validate, then write through a temporary file and ``os.replace`` (never a torn file)."""
    data = _clean(evidence)
    validate(data)
    write_json_atomic(path, data, prefix=".evidence-")


def load(path: Path) -> dict[str, Any]:
    """Read and validate an evidence file; errors name the file and the line or field."""
    if path.is_dir():
        raise RLEngineError(f"{path} is a directory, not an evidence file")
    if not path.is_file():
        raise RLEngineError(f"evidence file not found: {path}")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RLEngineError(f"{path}: not UTF-8 text (byte {exc.start}): not an evidence file") from exc
    except json.JSONDecodeError as exc:
        raise RLEngineError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    try:
        validate(data)
    except RLEngineError as exc:
        raise RLEngineError(f"{path}: {exc}") from exc
    return data
