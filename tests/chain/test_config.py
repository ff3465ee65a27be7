"""Qwen3Config: Hugging Face field names, no silent defaults for the fields that change numbers."""

from __future__ import annotations

import json

import pytest

from rl_engine.chain.config import PRESETS, ConfigError, Qwen3Config, get_config

QWEN3_8B_JSON = {  # the fields of Qwen/Qwen3-8B's config.json that the chain reads, plus neighbours
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_qwen3_8b_json_matches_preset():
    cfg = Qwen3Config.from_dict(QWEN3_8B_JSON)
    assert cfg == PRESETS["qwen3-8b"]
    assert isinstance(cfg.rope_theta, float)
    assert cfg.q_size == 4096 and cfg.kv_size == 1024


def test_tiny_preset_is_pitfall_p1_model():
    t = PRESETS["tiny"]
    assert (t.num_hidden_layers, t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim,
            t.intermediate_size, t.vocab_size) == (2, 256, 4, 2, 64, 512, 151936)
    smoke = PRESETS["tiny-smoke"]
    assert smoke.vocab_size < t.vocab_size
    assert {k: v for k, v in smoke.to_dict().items() if k != "vocab_size"} == \
           {k: v for k, v in t.to_dict().items() if k != "vocab_size"}


@pytest.mark.parametrize("field", ["head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                                   "vocab_size", "max_position_embeddings"])
def test_missing_required_field_is_named(field):
    d = dict(QWEN3_8B_JSON)
    del d[field]
    with pytest.raises(ConfigError, match=field):
        Qwen3Config.from_dict(d)


def test_null_required_field_is_named():
    d = dict(QWEN3_8B_JSON, rms_norm_eps=None)
    with pytest.raises(ConfigError, match="rms_norm_eps"):
        Qwen3Config.from_dict(d)


def test_rope_parameters_layout_of_transformers_5():
    d = dict(QWEN3_8B_JSON)
    del d["rope_theta"]
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    assert Qwen3Config.from_dict(d).rope_theta == PRESETS["qwen3-8b"].rope_theta
    d["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0}
    with pytest.raises(ConfigError, match="rope_type"):
        Qwen3Config.from_dict(d)


@pytest.mark.parametrize("patch,word", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "qwen3_moe"}, "model_type"),
    ({"num_key_value_heads": 5}, "num_key_value_heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
])
def test_unsupported_or_bad_values_raise(patch, word):
    with pytest.raises(ConfigError, match=word):
        Qwen3Config.from_dict(dict(QWEN3_8B_JSON, **patch))


def test_from_json_file_and_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B_JSON))
    assert Qwen3Config.from_json(tmp_path / "config.json") == PRESETS["qwen3-8b"]
    assert Qwen3Config.from_json(tmp_path) == PRESETS["qwen3-8b"]
    assert get_config(str(tmp_path)) == PRESETS["qwen3-8b"]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Qwen3Config.from_json(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="no such file"):
        Qwen3Config.from_json(tmp_path / "missing.json")


def test_hf_dict_round_trip(tmp_path):
    cfg = PRESETS["tiny"]
    cfg.write_json(tmp_path / "config.json")
    assert Qwen3Config.from_json(tmp_path) == cfg
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["model_type"] == "qwen3" and d["attention_bias"] is False and d["hidden_act"] == "silu"


def test_unknown_model_name():
    with pytest.raises(ConfigError, match="unknown model"):
        get_config("qwen3-9000b")
