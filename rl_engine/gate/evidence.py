"""Evidence artifacts: schema validation and atomic writes."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

from rl_engine.errors import RLEngineError

SCHEMA_VERSION = "rl_engine.evidence/1"
_SCHEMA = Path(__file__).resolve().parent / "evidence.schema.json"


def _clean(obj: Any) -> Any:
    """JSON has no inf/NaN: encode them as strings so the file stays strict JSON."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def validate(evidence: dict[str, Any]) -> None:
    """Raise RLEngineError naming the first field that breaks the evidence schema."""
    schema = json.loads(_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(evidence), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "<root>"
        raise RLEngineError(f"evidence does not match its schema at {where}: {e.message}")


def write_atomic(path: Path, evidence: dict[str, Any]) -> None:
    """Validate, then write through a temporary file and ``os.replace`` (never a torn file)."""
    data = _clean(evidence)
    validate(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".evidence-", suffix=".json", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; evidence is read by others, like the reports
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=False, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
    validate(data)
    return data
