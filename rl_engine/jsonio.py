"""Strict JSON and atomic writes, shared by every artifact the package writes (evidence,
parity, bench, tp): a crash or Ctrl-C never leaves a torn file behind."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def strict_json(obj: Any) -> Any:
    """JSON has no inf/NaN: encode them as strings; tuples become lists; tensors are refused."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, str):
        return str(obj)  # also str subclasses such as torch's TorchVersion
    if type(obj).__module__.startswith("torch") and type(obj).__name__ in ("Tensor", "Parameter"):
        raise TypeError(f"a {type(obj).__name__} does not go into a JSON artifact")
    return obj


def schema_problem(schema: dict[str, Any], doc: Any) -> str | None:
    """``"at PATH: MESSAGE"`` for the most relevant way ``doc`` breaks ``schema`` (jsonschema's
    :func:`~jsonschema.exceptions.best_match`), or None when it validates."""
    import jsonschema
    from jsonschema.exceptions import best_match

    e = best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    if e is None:
        return None
    return f"at {'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"


def write_bytes_atomic(path: Path, data: bytes, prefix: str | None = None) -> None:
    """Write through a temporary file in the same folder and ``os.replace``; mode follows the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix or f".{path.name}-", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; artifacts are read by others
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text_atomic(path: Path, text: str, prefix: str | None = None) -> None:
    """:func:`write_bytes_atomic` of the UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"), prefix)


def write_json_atomic(path: Path, data: Any, prefix: str | None = None) -> None:
    """:func:`strict_json`, then :func:`write_text_atomic`."""
    write_text_atomic(path, json.dumps(strict_json(data), indent=1, allow_nan=False) + "\n", prefix)
