"""Qwen3 dense model configuration, with the field names of the Hugging Face ``config.json``.

Shape glossary: E hidden (``hidden_size``), F ffn (``intermediate_size``), H query heads
(``num_attention_heads``), Hkv KV heads (``num_key_value_heads``), D head dim (``head_dim``),
V vocab (``vocab_size``).

Fields that change the numbers and that some code bases fill in silently are REQUIRED here:
``head_dim`` (Qwen3 is not ``hidden_size // num_attention_heads``: Qwen3-0.6B has 1024 / 16 = 64 but
``head_dim`` 128), ``rms_norm_eps`` (docs/pitfalls.md P12), ``rope_theta`` (docs/pitfalls.md P3) and
``tie_word_embeddings``. A missing one raises :class:`ConfigError` naming the field.

Source: ``transformers.models.qwen3.configuration_qwen3.Qwen3Config`` and the Qwen3 ``config.json``
files on the Hugging Face hub.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rl_engine.errors import RLEngineError


class ConfigError(RLEngineError, ValueError):
    """A model config is missing a required field, has a wrong value, or asks for an unsupported feature."""


_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class Qwen3Config:
    """Qwen3 dense architecture (Hugging Face ``config.json`` field names).

    Every field is required; there are no defaults (see the module docstring for why).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{name}: expected a positive integer, got {v!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{name}: expected a positive finite number, got {v!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigError(f"tie_word_embeddings: expected true or false, got {self.tie_word_embeddings!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim: RoPE rotate-half needs an even head dim, got {self.head_dim}")

    # -- derived sizes --------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """H * D: width of the query projection."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Hkv * D: width of the key / value projections."""
        return self.num_key_value_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """``D ** -0.5`` (Hugging Face Qwen3 ``self.scaling``)."""
        return self.head_dim ** -0.5

    def num_parameters(self) -> int:
        e, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        per_layer = e * self.q_size + 2 * e * self.kv_size + self.q_size * e + 3 * e * f + 2 * self.head_dim + 2 * e
        return v * e * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * per_layer + e

    # -- (de)serialisation ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> Qwen3Config:
        """Build from a ``config.json`` dict.

        Required fields are listed in the module docstring; a missing one raises ConfigError
        naming it. ``rope_theta`` may also come from ``rope_parameters.rope_theta`` (the layout of
        ``transformers`` 5 configs); where both are given they must agree. A ``config.json`` written
        by ``transformers`` (``save_pretrained``) loads as is: fields that do not change the
        numbers (``architectures``, ``dtype``, ``initializer_range``, ``max_window_layers``, a
        ``sliding_window`` that ``use_sliding_window=false`` switches off, token ids, ...) are
        ignored. Features this chain does not implement raise ConfigError naming the field instead
        of being ignored: ``rope_scaling`` or ``rope_parameters.rope_type`` other than
        null/``default``, ``use_sliding_window=true``, a ``layer_types`` entry other than
        ``full_attention``, ``attention_bias=true``, a ``hidden_act`` other than ``silu``, a
        ``model_type`` other than ``qwen3``.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        d = dict(data)
        model_type = d.get("model_type")
        if model_type is not None and model_type != "qwen3":
            raise ConfigError(f"{source}: model_type {model_type!r} is not supported (only 'qwen3' dense)")
        rp = d.get("rope_parameters")
        if rp is not None:
            if not isinstance(rp, dict):
                raise ConfigError(f"{source}: rope_parameters: expected a JSON object or null, got {rp!r}")
            if rp.get("rope_type", "default") != "default":
                raise ConfigError(f"{source}: rope_parameters.rope_type {rp.get('rope_type')!r} is not supported "
                                  f"(plain RoPE only)")
            if "rope_theta" in rp:
                if d.get("rope_theta") is not None and d["rope_theta"] != rp["rope_theta"]:
                    raise ConfigError(f"{source}: rope_theta {d['rope_theta']!r} disagrees with "
                                      f"rope_parameters.rope_theta {rp['rope_theta']!r}")
                d["rope_theta"] = rp["rope_theta"]
        for key in ("rope_scaling",):
            v = d.get(key)
            if v is not None and not (isinstance(v, dict) and v.get("rope_type", v.get("type")) == "default"):
                raise ConfigError(f"{source}: {key} {v!r} is not supported (plain RoPE only)")
        if d.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window=true is not supported")
        layer_types = d.get("layer_types")
        if layer_types is not None:
            if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
                raise ConfigError(f"{source}: layer_types: expected a list of strings, got {layer_types!r}")
            other = sorted({t for t in layer_types if t != "full_attention"})
            if other:
                raise ConfigError(f"{source}: layer_types {other} are not supported (full_attention only: "
                                  f"no sliding-window layers)")
            if isinstance(d.get("num_hidden_layers"), int) and len(layer_types) != d["num_hidden_layers"]:
                raise ConfigError(f"{source}: layer_types has {len(layer_types)} entries, "
                                  f"num_hidden_layers is {d['num_hidden_layers']}")
        if d.get("attention_bias"):
            raise ConfigError(f"{source}: attention_bias=true is not supported (Qwen3 has no attention biases)")
        act = d.get("hidden_act")
        if act is not None and act != "silu":
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported (Qwen3 uses silu)")
        missing = [k for k in _REQUIRED if k not in d or d[k] is None]
        if missing:
            raise ConfigError(f"{source}: missing required field{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)} (no defaults are assumed)")
        kwargs = {k: d[k] for k in _REQUIRED}
        for k in ("rms_norm_eps", "rope_theta"):
            if isinstance(kwargs[k], int) and not isinstance(kwargs[k], bool):
                kwargs[k] = float(kwargs[k])
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    @classmethod
    def from_json(cls, path: str | Path) -> Qwen3Config:
        """Read a ``config.json`` file (or a checkpoint directory holding one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise ConfigError(f"{p}: no such file")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}: not valid JSON at line {exc.lineno}: {exc.msg}") from exc
        return cls.from_dict(data, source=str(p))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` that ``transformers.Qwen3ForCausalLM`` loads (plain RoPE, no biases)."""
        d = self.to_dict()
        d.update({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu",
                  "attention_bias": False, "attention_dropout": 0.0, "rope_scaling": None,
                  "use_sliding_window": False, "torch_dtype": "bfloat16", "initializer_range": 0.02,
                  "use_cache": True})
        return d

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_hf_dict(), indent=2) + "\n")


PRESETS: dict[str, Qwen3Config] = {
    # the model of docs/pitfalls.md P1: 2 layers, hidden 256, 4 query heads, 2 KV heads, head dim 64, V = 151936
    "tiny": Qwen3Config(vocab_size=151936, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
                        rope_theta=1e6, tie_word_embeddings=False, max_position_embeddings=40960),
    # the tiny model with a 5000-token vocabulary: the Triton CPU interpreter spends ~15 s per
    # logprob-head call at V = 151936 and ~0.5 s here; 5000 still spans two fixed 4096-wide V
    # chunks with a ragged tail. Used by the smoke gate and the CPU chain tests.
    "tiny-smoke": Qwen3Config(vocab_size=5000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
                              rope_theta=1e6, tie_word_embeddings=False, max_position_embeddings=40960),
    # Qwen/Qwen3-8B config.json
    "qwen3-8b": Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                            rope_theta=1e6, tie_word_embeddings=False, max_position_embeddings=40960),
}


def get_config(name_or_path: str | Path) -> Qwen3Config:
    """A preset (``tiny``, ``qwen3-8b``) or a ``config.json`` / checkpoint directory path."""
    if isinstance(name_or_path, str) and name_or_path in PRESETS:
        return PRESETS[name_or_path]
    p = Path(name_or_path)
    if p.exists():
        return Qwen3Config.from_json(p)
    raise ConfigError(f"unknown model {str(name_or_path)!r}: not a preset ({', '.join(PRESETS)}) and no such path")


def config_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Qwen3Config))
