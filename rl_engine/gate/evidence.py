"""Evidence artifacts: schema validation, atomic writes, and reading (plain or gzipped)."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

from rl_engine.jsonio import schema_problem, strict_json, write_json_atomic

from rl_engine.errors import RLEngineError

SCHEMA_VERSION = "rl_engine.evidence/1"
_SCHEMA = Path(__file__).resolve().parent / "evidence.schema.json"
FILE_NAME = "evidence.json"
"""What the gate writes (always plain JSON)."""
GZIP_NAME = FILE_NAME + ".gz"
"""How committed gate folders other than the newest store it: the device tool copies at most 64 MiB
of working tree per call and a gate's evidence.json is ~1.6 MB of JSON that gzip shrinks ~10x
(evidence/README.md)."""


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


def find(path: Path) -> Path:
    """The evidence file ``path`` names: a file as given, or a folder's ``evidence.json``, else its
    ``evidence.json.gz``. A folder holding both is refused: which one is the record would be a
    guess, and the two may differ (a gate run into a folder whose record was gzipped)."""
    if not path.is_dir():
        return path
    plain, packed = path / FILE_NAME, path / GZIP_NAME
    if plain.exists() and packed.exists():
        raise RLEngineError(f"{path} holds both {FILE_NAME} and {GZIP_NAME}: ambiguous, which one is the "
                            "evidence? remove the other")
    return packed if packed.exists() else plain


def load(path: Path) -> dict[str, Any]:
    """Read and validate an evidence file (``.gz``: gzipped), or a folder's (``find``); errors
    name the file and the line or field."""
    path = find(path)
    if path.is_dir():
        raise RLEngineError(f"{path} is a directory, not an evidence file")
    if not path.is_file():
        raise RLEngineError(f"evidence file not found: {path}")
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError; a cut file, EOFError
            raise RLEngineError(f"{path}: not a readable gzip file ({exc}): not an evidence file") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RLEngineError(f"{path}: not UTF-8 text (byte {exc.start}): not an evidence file") from exc
    except json.JSONDecodeError as exc:
        raise RLEngineError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    try:
        validate(data)
    except RLEngineError as exc:
        raise RLEngineError(f"{path}: {exc}") from exc
    return data
