"""Loading user tensors safely: ``.pt`` (weights_only), ``.npy`` (no pickles), ``.safetensors``."""

from __future__ import annotations

from pathlib import Path

import torch

from rl_engine.errors import InputError


_ANSI = __import__("re").compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _refused_pickle(p: Path, exc: BaseException) -> InputError:
    """Our own one-line message for a ``.pt`` that ``weights_only=True`` refuses (torch's own text
    has terminal colour codes and advises turning the protection off)."""
    import re

    text = _ANSI.sub("", str(exc))
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    what = f" (it needs {found.group(1)})" if found else ""
    return InputError(f"{p}: refused: the file holds pickled Python objects besides plain tensors{what}, and loading "
                      "them could run code; save plain tensors (torch.save of a tensor or a dict of tensors), "
                      "or use .safetensors or .npy")


_HEAD_BYTES = 64
_TORCH_ZIP = b"PK\x03\x04"  # torch.save since torch 1.6: a zip archive
_PICKLE_PROTO = b"\x80"  # torch.save(..., _use_new_zipfile_serialization=False): a pickle, protocol >= 2
_NPY_MAGIC = b"\x93NUMPY"
_SAFETENSORS_MAX_HEADER = 100_000_000  # bytes: the JSON header limit safetensors itself enforces


def _kind(head: bytes) -> str:
    """What the first bytes of a file say it is: ``torch``, ``npy``, ``safetensors``, ``empty``,
    ``text`` or ``binary``. Only the leading bytes are read; nothing is decoded further."""
    if not head:
        return "empty"
    if head.startswith(_TORCH_ZIP) or head.startswith(_PICKLE_PROTO):
        return "torch"
    if head.startswith(_NPY_MAGIC):
        return "npy"
    # safetensors: an 8-byte little-endian header length, then the JSON header
    if len(head) > 8 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= _SAFETENSORS_MAX_HEADER:
        return "safetensors"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a multi-byte character cut at the end of the head is still text
        text = head[: exc.start].decode("utf-8") if exc.start >= len(head) - 3 else ""
    text = text.lstrip("\ufeff")  # a UTF-8 byte-order mark
    if text and all(ch.isprintable() or ch in "\t\r\n" for ch in text):
        return "text"
    return "binary"


def _describe(head: bytes) -> str:
    """``it is empty`` / ``it starts with text '...'`` / ``it is a NumPy .npy file`` / ... for messages."""
    kind = _kind(head)
    if kind == "empty":
        return "it is empty (0 bytes)"
    if kind == "text":
        first = head.decode("utf-8", errors="ignore").lstrip("\ufeff").strip().splitlines()
        shown = first[0][:40] if first else ""
        return f"it starts with text {shown!r}" if shown else "it holds only blank text"
    if kind == "npy":
        return "it is a NumPy .npy file (give it the .npy extension)"
    if kind == "safetensors":
        return "it is a safetensors file (give it the .safetensors extension)"
    if kind == "torch":
        return "it is a torch.save file (give it the .pt extension)"
    return "it starts with the bytes " + " ".join(f"{b:02x}" for b in head[:8])


def _head(p: Path) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(_HEAD_BYTES)
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from None


def load_tensor(path: str | Path, key: str | None = None, npy_bf16: bool = False) -> torch.Tensor:
    """Load one tensor. Never executes code from the file.

    The extension says what the file must be (``.pt``/``.pth``: a ``torch.save`` file, ``.npy``:
    a ``numpy.save`` file, ``.safetensors``), and the first bytes are checked against it before
    any loader runs, so a text file or a file of another kind is named as what it is.

    ``npy_bf16``: a ``.npy`` file holds raw BF16 bit patterns as uint16 or int16 (NumPy has no
    bfloat16); they are reinterpreted, not converted.

    Raises InputError naming the file when it is missing, has an unknown extension, does not hold
    what its extension says, holds a pickle that is not plain tensor data, or holds several
    tensors and no ``key`` picks one.
    """
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a tensor file")
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    suffix = p.suffix.lower()
    if suffix not in (".pt", ".pth", ".npy", ".safetensors"):
        what = f"unknown extension {suffix!r}" if suffix else "no extension"
        raise InputError(f"{p}: {what}; expected .pt or .pth (torch.save), .npy (numpy.save) or .safetensors")
    head = _head(p)
    if suffix in (".pt", ".pth"):
        import pickle

        if _kind(head) != "torch":
            raise InputError(f"{p}: not a torch.save file: {_describe(head)}; expected the binary zip archive "
                             "that torch.save writes")
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            text = _ANSI.sub("", str(exc))
            if "Weights only load failed" in text or "Unsupported global" in text:  # weights_only refused it
                raise _refused_pickle(p, exc) from None
            raise InputError(f"{p}: not a readable torch.save file (damaged or cut short?): "
                             f"{_first_line(exc)}") from None
        except Exception as exc:
            raise InputError(f"{p}: not a readable torch.save file (damaged or cut short?): "
                             f"{type(exc).__name__}: {_first_line(exc)}") from None
        return _pick(p, obj, key)
    if suffix == ".npy":
        import numpy as np

        if _kind(head) != "npy":
            raise InputError(f"{p}: not a .npy file: {_describe(head)}; expected a file written by numpy.save")
        try:
            arr = np.load(p, allow_pickle=False)
        except ValueError as exc:
            if "allow_pickle" in str(exc):  # an object array: its elements are pickled Python objects
                raise InputError(f"{p}: refused: an object array, whose elements are pickled Python "
                                 "objects that loading could run as code; save a numeric array") from None
            raise InputError(f"{p}: not a readable .npy file (damaged or cut short?): {_first_line(exc)}") from None
        if key is not None:
            raise InputError(f"{p}: a .npy file holds a single array, so a key ({key!r}) cannot pick one; drop it")
        if npy_bf16:
            if arr.dtype not in (np.uint16, np.int16):
                raise InputError(f"{p}: --npy-bf16 needs uint16 or int16 raw BF16 bits, the file holds {arr.dtype}")
            return torch.from_numpy(arr.astype(np.int16, copy=True)).view(torch.bfloat16)
        return torch.from_numpy(arr.copy())
    from safetensors.torch import load_file

    if _kind(head) != "safetensors":
        raise InputError(f"{p}: not a .safetensors file: {_describe(head)}; expected a file written by "
                         "safetensors' save_file")
    try:
        tensors = load_file(str(p))
    except Exception as exc:
        raise InputError(f"{p}: not a readable .safetensors file (damaged or cut short?): {_first_line(exc)}") from None
    return _pick(p, tensors, key)


def _first_line(exc: BaseException) -> str:
    lines = _ANSI.sub("", str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _pick(p: Path, obj: object, key: str | None) -> torch.Tensor:
    if isinstance(obj, torch.Tensor):
        if key is not None:
            raise InputError(f"{p}: holds a single tensor, so --key {key!r} cannot pick one; drop --key")
        return obj
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if key is not None:
            if key not in tensors:
                raise InputError(f"{p}: no tensor named {key!r}; it holds {sorted(tensors)}")
            return tensors[key]
        if len(tensors) == 1:
            return next(iter(tensors.values()))
        raise InputError(f"{p}: holds {len(tensors)} tensors {sorted(tensors)[:10]}; pick one with --key")
    raise InputError(f"{p}: holds a {type(obj).__name__}, not a tensor")


_SAFE_NAME = __import__("re").compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def safe_output_path(out_dir: Path, name: str) -> Path:
    """``out_dir / name`` for a file name that may come from input data (an op or backend name in
    an evidence file, a tensor name in a dump). Refuses anything that could leave ``out_dir``:
    separators, ``..``, absolute paths, leading dots, empty names.

    Raises InputError naming the offending name.
    """
    from rl_engine.errors import InputError

    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise InputError(f"refusing to write a file named {name!r}: only letters, digits, '_', '.', '-' "
                         "(no path separators or '..') are allowed in names taken from input data")
    target = (out_dir / name).resolve()
    if target.parent != out_dir.resolve():
        raise InputError(f"refusing to write {target}: outside {out_dir}")
    return target
