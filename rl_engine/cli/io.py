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


def load_tensor(path: str | Path, key: str | None = None, npy_bf16: bool = False) -> torch.Tensor:
    """Load one tensor. Never executes code from the file.

    ``npy_bf16``: a ``.npy`` file holds raw BF16 bit patterns as uint16 or int16 (NumPy has no
    bfloat16); they are reinterpreted, not converted.

    Raises InputError naming the file when it is missing, of an unknown kind, holds a pickle that
    is not plain tensor data, or holds several tensors and no ``key`` picks one.
    """
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a tensor file")
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    suffix = p.suffix.lower()
    if suffix in (".pt", ".pth"):
        import pickle

        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:  # weights_only refuses arbitrary pickles
            raise _refused_pickle(p, exc) from None
        except Exception as exc:
            first = _ANSI.sub("", str(exc)).strip().splitlines()
            raise InputError(f"{p}: not a readable torch file: {type(exc).__name__}: {first[0] if first else ''}") from None
        return _pick(p, obj, key)
    if suffix == ".npy":
        import numpy as np

        try:
            arr = np.load(p, allow_pickle=False)
        except ValueError as exc:
            raise InputError(f"{p}: refused to load (pickled .npy files are not accepted): {exc}") from exc
        if key is not None:
            raise InputError(f"{p}: a .npy file holds a single array, so a key ({key!r}) cannot pick one; drop it")
        if npy_bf16:
            if arr.dtype not in (np.uint16, np.int16):
                raise InputError(f"{p}: --npy-bf16 needs uint16 or int16 raw BF16 bits, the file holds {arr.dtype}")
            return torch.from_numpy(arr.astype(np.int16, copy=True)).view(torch.bfloat16)
        return torch.from_numpy(arr.copy())
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(p))
        except Exception as exc:
            raise InputError(f"{p}: not a valid safetensors file: {exc}") from exc
        return _pick(p, tensors, key)
    raise InputError(f"{p}: unknown file kind {suffix!r}; use .pt, .npy or .safetensors")


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
