"""Qwen3 dense weights: one container for seeded synthetic weights and for safetensors checkpoints.

Shape glossary: V vocab, E hidden, F ffn, H query heads, Hkv KV heads, D head dim.
Tensor names and shapes follow the Hugging Face ``Qwen3ForCausalLM`` state dict (``nn.Linear``
weights are ``[out_features, in_features]``):

=============================================================  =================
``model.embed_tokens.weight``                                  ``[V, E]``
``model.layers.{i}.self_attn.q_proj.weight``                   ``[H*D, E]``
``model.layers.{i}.self_attn.k_proj.weight`` / ``v_proj``      ``[Hkv*D, E]``
``model.layers.{i}.self_attn.o_proj.weight``                   ``[E, H*D]``
``model.layers.{i}.self_attn.q_norm.weight`` / ``k_norm``      ``[D]``
``model.layers.{i}.input_layernorm.weight``                    ``[E]``
``model.layers.{i}.post_attention_layernorm.weight``           ``[E]``
``model.layers.{i}.mlp.gate_proj.weight`` / ``up_proj``        ``[F, E]``
``model.layers.{i}.mlp.down_proj.weight``                      ``[E, F]``
``model.norm.weight``                                          ``[E]``
``lm_head.weight`` (absent when ``tie_word_embeddings``)       ``[V, E]``
=============================================================  =================

Kernel backends run on BF16 weights; the FP32 reference chain runs on :meth:`Qwen3Weights.upcast`
(the same BF16 values in FP32, WS1 §3.1). A checkpoint tensor that is missing, of the wrong shape
or not BF16 raises :class:`WeightError` naming it; nothing is cast or reshaped silently. What loads
and what is refused, the tied-embedding rule and saving for ``transformers``: docs/checkpoints.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_engine.chain.config import Qwen3Config
from rl_engine.ops.spec import standard_normal
from rl_engine.errors import RLEngineError


class WeightError(RLEngineError, ValueError):
    """A weight tensor is missing, unexpected, of the wrong shape or of the wrong dtype."""


LAYER_TENSORS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints carry; recomputed from ``rope_theta``, never read."""


def _attr(name: str) -> str:
    """``self_attn.q_proj.weight`` -> ``q_proj``; ``input_layernorm.weight`` -> ``input_layernorm``."""
    return name.split(".")[-2]


def expected_shapes(config: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the Hugging Face layout -> its shape, for ``config``."""
    e, f, v, d = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    q, kv = config.q_size, config.kv_size
    per_layer = {
        "self_attn.q_proj.weight": (q, e), "self_attn.k_proj.weight": (kv, e),
        "self_attn.v_proj.weight": (kv, e), "self_attn.o_proj.weight": (e, q),
        "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
        "input_layernorm.weight": (e,), "post_attention_layernorm.weight": (e,),
        "mlp.gate_proj.weight": (f, e), "mlp.up_proj.weight": (f, e), "mlp.down_proj.weight": (e, f),
    }
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, e)}
    for i in range(config.num_hidden_layers):
        for name in LAYER_TENSORS:
            shapes[f"model.layers.{i}.{name}"] = per_layer[name]
    shapes["model.norm.weight"] = (e,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, e)
    return shapes


@dataclass
class LayerWeights:
    """One decoder layer (names as the Hugging Face modules, ``[out, in]`` for projections)."""

    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    input_layernorm: torch.Tensor
    post_attention_layernorm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor


@dataclass(frozen=True)
class PackedProjections:
    """One layer's q/k/v and gate/up weights as two row-stacked tensors: ``qkv [H*D + 2*Hkv*D, E]``
    (rows of q_proj, then k_proj, then v_proj) and ``gate_up [2F, E]`` (gate_proj, then up_proj).
    The layer's own fields are row slices (views) of these, so packing costs no memory."""

    qkv: torch.Tensor
    gate_up: torch.Tensor


def _stacked(parts: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    """The tensor whose consecutive row blocks ``parts`` already are (views of one buffer), or None."""
    base = parts[0]._base
    if base is None or base.dim() != 2 or base.shape[0] != sum(p.shape[0] for p in parts):
        return None
    row = 0
    for p in parts:
        if p._base is not base or p.data_ptr() != base[row].data_ptr() or p.stride() != base.stride():
            return None
        row += p.shape[0]
    return base


def pack_projections(layer: LayerWeights) -> PackedProjections:
    """Stack ``layer``'s q/k/v and gate/up weights into one tensor each (once: a layer whose fields
    are already such row slices is reused) and re-point the fields at row slices of them, so a
    decode step can run one GEMM for q/k/v and one for gate/up. Each output element of a stacked
    product is the same row-times-column reduction as in the separate products, so the bits do
    not change (``tests/chain/test_model.py``). Values never change; the old field tensors are
    released unless something else holds them."""
    groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}
    out = {}
    for key, names in groups.items():
        parts = tuple(getattr(layer, n) for n in names)
        stacked = _stacked(parts)
        if stacked is None:
            stacked = torch.cat(parts, 0)
            row = 0
            for n, p in zip(names, parts):
                setattr(layer, n, stacked[row : row + p.shape[0]])
                row += p.shape[0]
        out[key] = stacked
    return PackedProjections(**out)


@dataclass
class Qwen3Weights:
    """All weights of a Qwen3 dense model, on one device, in one dtype.

    ``lm_head`` is the same tensor object as ``embed_tokens`` when the config ties them.
    ``provenance`` records how the weights were made (seeded generation or checkpoint path).
    """

    config: Qwen3Config
    embed_tokens: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` in the Hugging Face layout (``lm_head.weight`` only when untied)."""
        yield "model.embed_tokens.weight", self.embed_tokens
        for i, layer in enumerate(self.layers):
            for name in LAYER_TENSORS:
                yield f"model.layers.{i}.{name}", getattr(layer, _attr(name))
        yield "model.norm.weight", self.norm
        if not self.config.tie_word_embeddings:
            yield "lm_head.weight", self.lm_head

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.named_tensors())

    def validate(self, dtype: torch.dtype | None = None) -> None:
        """Check every tensor's shape, dtype (``dtype`` or the container's) and device."""
        want_dtype = dtype or self.dtype
        shapes = expected_shapes(self.config)
        seen = set()
        for name, t in self.named_tensors():
            seen.add(name)
            _check_one(name, t, shapes[name], want_dtype, where="weights")
            if t.device != self.device:
                raise WeightError(f"{name}: on {t.device}, the other weights are on {self.device}")
        missing = sorted(set(shapes) - seen)
        if missing:
            raise WeightError(f"weights: missing {missing[:5]}")
        if self.config.tie_word_embeddings and self.lm_head is not self.embed_tokens:
            raise WeightError("lm_head: tie_word_embeddings is true but lm_head is not the embedding tensor")

    def upcast(self, dtype: torch.dtype = torch.float32) -> Qwen3Weights:
        """The same values in ``dtype`` (FP32 for the reference chain; exact for BF16 -> FP32)."""
        embed = self.embed_tokens.to(dtype)
        layers = [LayerWeights(**{_attr(n): getattr(layer, _attr(n)).to(dtype) for n in LAYER_TENSORS})
                  for layer in self.layers]
        lm_head = embed if self.config.tie_word_embeddings else self.lm_head.to(dtype)
        prov = dict(self.provenance, upcast_to=str(dtype).replace("torch.", ""))
        return Qwen3Weights(self.config, embed, layers, self.norm.to(dtype), lm_head, prov)

    def content_hash(self) -> str:
        """SHA-256 over every tensor's name, shape, dtype and raw bytes (expensive for 8B: CPU copy)."""
        h = hashlib.sha256()
        for name, t in self.named_tensors():
            h.update(f"{name}:{list(t.shape)}:{t.dtype}".encode())
            h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


def _check_one(name: str, t: Any, shape: tuple[int, ...], dtype: torch.dtype, where: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise WeightError(f"{name}: expected a tensor in {where}, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise WeightError(f"{name}: expected shape {list(shape)}, got {list(t.shape)} in {where}")
    if t.dtype != dtype:
        raise WeightError(f"{name}: expected dtype {str(dtype).replace('torch.', '')}, "
                          f"got {str(t.dtype).replace('torch.', '')} in {where}")


def weights_from_named(config: Qwen3Config, tensors: dict[str, torch.Tensor],
                       provenance: dict[str, Any]) -> Qwen3Weights:
    """A :class:`Qwen3Weights` over ``tensors`` keyed by Hugging Face names (as :meth:`Qwen3Weights.named_tensors`
    yields them; with tied embeddings ``lm_head`` is the embedding tensor itself). No copies, no checks
    (the callers validate)."""
    layers = []
    for i in range(config.num_hidden_layers):
        layers.append(LayerWeights(**{_attr(n): tensors[f"model.layers.{i}.{n}"] for n in LAYER_TENSORS}))
    embed = tensors["model.embed_tokens.weight"]
    lm_head = embed if config.tie_word_embeddings else tensors["lm_head.weight"]
    return Qwen3Weights(config, embed, layers, tensors["model.norm.weight"], lm_head, provenance)


# -- seeded synthetic weights -----------------------------------------------------------------
SYNTHETIC_RECIPE = {
    "generator": "torch.Generator on the target device, one per tensor, seeded with "
                 "sha256(f'{seed}:{name}')[:8] (little endian, 63 bits): a tensor's values depend only on "
                 "the seed, its name, its shape and the device kind (CPU and CUDA generators differ)",
    "draw": "standard normal (a CPU generator draws in float64 and rounds to float32; CUDA draws float32), multiplied by std (and shifted for norms), rounded once to bfloat16",
    "std": {
        "model.embed_tokens.weight": "1.0 (untied) or logit_scale / sqrt(E) (tied)",
        "q_proj, k_proj, v_proj, gate_proj, up_proj": "1 / sqrt(E)",
        "o_proj": "1 / sqrt(H*D)",
        "down_proj": "1 / sqrt(F)",
        "norm weights (input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm)": "1 + 0.1 * N(0, 1)",
        "lm_head.weight": "logit_scale / sqrt(E): with the final norm's output at RMS ~1 the logits have a "
                          "standard deviation of about logit_scale",
    },
}
NORM_JITTER = 0.1
"""Norm weights are ``1 + NORM_JITTER * N(0, 1)``: around 1, never exactly 1, so a dropped weight shows."""


def tensor_seed(seed: int, name: str) -> int:
    """The generator seed of one synthetic tensor (63 bits of sha256 of ``'{seed}:{name}'``)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _std_for(config: Qwen3Config, name: str, logit_scale: float) -> tuple[float, float]:
    """(mean, std) of the normal draw for tensor ``name``."""
    e = config.hidden_size
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 1.0, NORM_JITTER
    if name == "model.embed_tokens.weight":
        return 0.0, (logit_scale / math.sqrt(e)) if config.tie_word_embeddings else 1.0
    if name == "lm_head.weight":
        return 0.0, logit_scale / math.sqrt(e)
    if name.endswith("o_proj.weight"):
        return 0.0, 1.0 / math.sqrt(config.q_size)
    if name.endswith("down_proj.weight"):
        return 0.0, 1.0 / math.sqrt(config.intermediate_size)
    return 0.0, 1.0 / math.sqrt(e)


def synthetic_weights(config: Qwen3Config, seed: int, *, logit_scale: float = 1.0,
                      device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> Qwen3Weights:
    """Seeded synthetic weights generated directly on ``device`` (see :data:`SYNTHETIC_RECIPE`).

    ``logit_scale`` sets the standard deviation of the logits (it scales ``lm_head``; with tied
    embeddings it scales the shared table). Returns BF16 tensors by default. Generation is on the
    device with a seeded per-tensor generator, so the 8B model takes seconds on a GPU; the values
    differ between CPU and CUDA generators (the provenance records the device kind).

    Raises
    ------
    WeightError
        ``logit_scale`` is not a positive finite number.
    """
    if isinstance(logit_scale, bool) or not isinstance(logit_scale, (int, float)) or not (
            math.isfinite(logit_scale) and logit_scale > 0):
        raise WeightError(f"logit_scale: expected a positive finite number, got {logit_scale!r}")
    device = torch.device(device)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(config).items():
        gen = torch.Generator(device=device)
        gen.manual_seed(tensor_seed(seed, name))
        mean, std = _std_for(config, name, float(logit_scale))
        x = standard_normal(shape, gen)
        x.mul_(std)
        if mean:
            x.add_(mean)
        tensors[name] = x.to(dtype)
        del x
    prov = {"kind": "synthetic", "seed": int(seed), "logit_scale": float(logit_scale),
            "device_kind": device.type, "dtype": str(dtype).replace("torch.", ""), "recipe": SYNTHETIC_RECIPE}
    w = weights_from_named(config, tensors, prov)
    w.validate(dtype)
    return w


# -- safetensors checkpoints ------------------------------------------------------------------
INDEX_FILE = "model.safetensors.index.json"
_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
              "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
              "U8": torch.uint8, "BOOL": torch.bool}
"""safetensors header dtype codes -> torch dtypes (a code not listed is reported as written, e.g. ``F8_E4M3``)."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class _Stored:
    """One tensor as a safetensors header describes it (nothing read yet)."""

    file: Path
    dtype: str
    shape: tuple[int, ...]


def _checkpoint_files(root: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The files of checkpoint ``root`` and the index's ``weight_map`` (tensor name -> shard file
    name): with ``model.safetensors.index.json`` the shards it names, else every ``*.safetensors``
    file and None. Raises WeightError for a malformed index or a shard it names that is absent."""
    index = root / INDEX_FILE
    if not index.is_file():
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise WeightError(f"{root}: no *.safetensors files and no {INDEX_FILE}")
        return files, None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise WeightError(f"{index}: not a valid safetensors index ({exc!r})") from exc
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightError(f"{index}: weight_map must map tensor names to shard file names")
    by_file: dict[str, list[str]] = {}
    for name, fname in weight_map.items():
        by_file.setdefault(fname, []).append(name)
    for fname, names in sorted(by_file.items()):
        if fname in ("", ".", "..") or Path(fname).name != fname:
            raise WeightError(f"{index}: shard {fname!r} (for {names[0]}) is not a file name in {root}")
        if not (root / fname).is_file():
            more = f" and {len(names) - 1} more tensors" if len(names) > 1 else ""
            raise WeightError(f"{index}: names shard {fname} (holding {names[0]}{more}), which does not exist "
                              f"in {root}")
    return [root / f for f in sorted(by_file)], weight_map


def _read_headers(files: list[Path]) -> dict[str, _Stored]:
    """Every tensor's file, dtype and shape from the safetensors headers (no tensor data is read)."""
    from safetensors import SafetensorError, safe_open

    stored: dict[str, _Stored] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                entries = []
                for name in sf.keys():
                    sl = sf.get_slice(name)
                    code = sl.get_dtype()
                    dtype = _dtype_name(_ST_DTYPES[code]) if code in _ST_DTYPES else code
                    entries.append((name, _Stored(f, dtype, tuple(sl.get_shape()))))
        except (SafetensorError, OSError) as exc:
            raise WeightError(f"{f}: not a readable safetensors file ({exc})") from exc
        for name, entry in entries:
            if name in stored:
                raise WeightError(f"{name}: present in both {stored[name].file.name} and {f.name}")
            stored[name] = entry
    return stored


def _header_problems(config: Qwen3Config, stored: dict[str, _Stored], weight_map: dict[str, str] | None,
                     dtype: torch.dtype) -> list[str]:
    """Every disagreement between the headers (and index) and the tensors ``config`` needs, each
    as ``'<tensor>: <problem>'``; empty when the checkpoint fits."""
    problems = []
    if weight_map is not None:
        for name, fname in weight_map.items():
            if name not in stored:
                problems.append(f"{name}: listed in {INDEX_FILE} under {fname}, which does not hold it")
            elif stored[name].file.name != fname:
                problems.append(f"{name}: listed in {INDEX_FILE} under {fname}, but stored in "
                                f"{stored[name].file.name}")
        problems += [f"{name}: stored in {s.file.name} but not listed in {INDEX_FILE}"
                     for name, s in stored.items() if name not in weight_map]
    shapes = expected_shapes(config)
    if config.tie_word_embeddings and "lm_head.weight" in stored:
        shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]  # allowed; must equal the embedding
    want = _dtype_name(dtype)
    for name, shape in shapes.items():
        s = stored.get(name)
        if s is None:
            hint = (" (config.json says tie_word_embeddings=false; a checkpoint that shares the embedding "
                    "as the output head needs tie_word_embeddings=true)") if name == "lm_head.weight" else ""
            problems.append(f"{name}: missing from the checkpoint{hint}")
        elif s.shape != tuple(shape):
            problems.append(f"{name}: expected shape {list(shape)}, got {list(s.shape)} in {s.file.name}")
        elif s.dtype != want:
            problems.append(f"{name}: expected dtype {want}, got {s.dtype} in {s.file.name}")
    problems += [f"{name}: unexpected tensor in {s.file.name} (not part of a Qwen3 dense model with this config)"
                 for name, s in stored.items() if name not in shapes and not name.endswith(_IGNORED_SUFFIXES)]
    return problems


def load_checkpoint(path: str | Path, config: Qwen3Config | None = None, *,
                    device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> Qwen3Weights:
    """Load a Hugging Face Qwen3 safetensors checkpoint directory into :class:`Qwen3Weights`.

    ``path`` holds ``model.safetensors`` (or any ``*.safetensors`` files), or the shards named by
    ``model.safetensors.index.json`` (what ``save_pretrained(..., max_shard_size=...)`` writes);
    ``config`` defaults to ``path/config.json`` (:meth:`Qwen3Config.from_json`, which accepts a
    ``transformers``-written file and refuses what this chain cannot run). Every tensor of
    :func:`expected_shapes` (table in the module docstring: ``[V, E]`` embedding, ``[out, in]``
    projections, ``[E]`` / ``[D]`` norms) must be present with exactly that shape and ``dtype``
    (BF16 by default; nothing is cast). Extra tensors are refused, except ``*.rotary_emb.inv_freq``
    buffers, which are ignored. With ``tie_word_embeddings`` the output head is the embedding
    tensor itself (as in ``transformers``): ``lm_head.weight`` is normally absent, and where
    present it must equal ``model.embed_tokens.weight`` bit for bit.

    All names, shapes and dtypes (and the index's shard assignment) are checked from the
    safetensors headers before any tensor data is read; then tensors are read with
    ``safetensors.safe_open`` (no pickles) and moved to ``device``.

    Returns
    -------
    Qwen3Weights
        In ``dtype`` on ``device``; ``provenance`` records the path and files.

    Raises
    ------
    WeightError
        Not a directory; no safetensors files; a malformed index, or a shard it names that does not
        exist (naming the index, the shard and a tensor it should hold); an unreadable file; a
        tensor stored twice, missing, unexpected, of the wrong shape or dtype, or not where the
        index says (all problems listed, each naming the tensor and its file); a tied
        ``lm_head.weight`` that differs from the embedding.
    ConfigError
        ``config`` is None and ``path/config.json`` is absent, malformed or unsupported.
    """
    from safetensors import safe_open

    root = Path(path)
    if not root.is_dir():
        raise WeightError(f"{root}: not a checkpoint directory")
    config = config or Qwen3Config.from_json(root / "config.json")
    files, weight_map = _checkpoint_files(root)
    stored = _read_headers(files)
    problems = _header_problems(config, stored, weight_map, dtype)
    if problems:
        more = ""
        if len(problems) > 1:
            shown = "; ".join(problems[1:6])
            more = f"; {len(problems) - 1} more: {shown}" + ("; ..." if len(problems) > 6 else "")
        cast = (" (tensors are never cast on load: save the checkpoint in the dtype asked for, or pass the "
                "stored dtype as dtype=)") if any(": expected dtype " in p for p in problems) else ""
        raise WeightError(f"{problems[0]} (checkpoint {root}){more}{cast}")
    device = torch.device(device)
    tensors: dict[str, torch.Tensor] = {}
    tied_head = None
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for name in sf.keys():
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    tied_head = sf.get_tensor(name)
                    continue
                tensors[name] = sf.get_tensor(name)
    if tied_head is not None:
        emb = tensors["model.embed_tokens.weight"]
        if not torch.equal(tied_head.contiguous().view(torch.uint8), emb.contiguous().view(torch.uint8)):
            raise WeightError(f"lm_head.weight: tie_word_embeddings is true but lm_head.weight in "
                              f"{stored['lm_head.weight'].file.name} differs from model.embed_tokens.weight")
    tensors = {name: t.to(device) for name, t in tensors.items()}
    prov = {"kind": "checkpoint", "path": str(root.resolve()), "files": [p.name for p in files],
            "dtype": _dtype_name(dtype)}
    w = weights_from_named(config, tensors, prov)
    w.validate(dtype)
    return w


def save_checkpoint(weights: Qwen3Weights, path: str | Path) -> Path:
    """Write ``config.json`` (:meth:`Qwen3Config.write_json`) and one ``model.safetensors`` in the
    Hugging Face layout (names and shapes of the module docstring, in the weights' own dtype,
    nothing cast) into ``path``, created if needed; returns ``path``.

    ``transformers.Qwen3ForCausalLM.from_pretrained(path)`` loads the result, and so does
    :func:`load_checkpoint`. With ``tie_word_embeddings`` no ``lm_head.weight`` is written (the
    embedding is the head, as ``transformers`` saves tied models).

    Raises
    ------
    WeightError
        ``weights`` fail :meth:`Qwen3Weights.validate`, or ``path`` already holds other
        ``*.safetensors`` files or an index (both checked before anything is written).
    """
    from safetensors.torch import save_file

    weights.validate()
    root = Path(path)
    stale = sorted(f.name for f in root.glob("*.safetensors*") if f.name != "model.safetensors")
    if stale:
        raise WeightError(f"{root}: already holds {', '.join(stale[:3])} (another checkpoint's shards or index, "
                          f"which a loader would read instead of or with model.safetensors); save into an "
                          f"empty directory")
    if root.exists() and not root.is_dir():
        raise WeightError(f"{root}: exists and is not a directory; save_checkpoint writes a directory "
                          "(config.json and model.safetensors)")
    root.mkdir(parents=True, exist_ok=True)
    weights.config.write_json(root / "config.json")
    tensors = {n: t.detach().contiguous().cpu() for n, t in weights.named_tensors()}
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return root
