"""Synthetic weights (seeded, logit-scale knob) and the safetensors loader through one container."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from rl_engine.chain.config import Qwen3Config
from rl_engine.chain.weights import (WeightError, expected_shapes, load_checkpoint, save_checkpoint,
                                     synthetic_weights)

SMALL = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                    rope_theta=1e6, tie_word_embeddings=False, max_position_embeddings=128)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _same_weights(a, b) -> bool:
    na, nb = dict(a.named_tensors()), dict(b.named_tensors())
    return na.keys() == nb.keys() and all(_bits_equal(na[k], nb[k].to(na[k].device)) for k in na)


def test_synthetic_is_seeded_and_bf16():
    a = synthetic_weights(SMALL, 7)
    b = synthetic_weights(SMALL, 7)
    c = synthetic_weights(SMALL, 8)
    assert _same_weights(a, b)
    assert not _bits_equal(a.embed_tokens, c.embed_tokens)
    assert all(t.dtype == torch.bfloat16 for _, t in a.named_tensors())
    assert set(dict(a.named_tensors())) == set(expected_shapes(SMALL))
    assert a.provenance["kind"] == "synthetic" and a.provenance["seed"] == 7


def test_tensor_values_do_not_depend_on_layer_count():
    deeper = dataclasses.replace(SMALL, num_hidden_layers=3)
    a, b = synthetic_weights(SMALL, 3), synthetic_weights(deeper, 3)
    assert _bits_equal(a.layers[1].down_proj, b.layers[1].down_proj)
    assert _bits_equal(a.lm_head, b.lm_head)


def test_logit_scale_changes_only_lm_head():
    a, b = synthetic_weights(SMALL, 1, logit_scale=1.0), synthetic_weights(SMALL, 1, logit_scale=4.0)
    na, nb = dict(a.named_tensors()), dict(b.named_tensors())
    for name in na:
        if name == "lm_head.weight":
            assert not _bits_equal(na[name], nb[name])
            assert float(nb[name].float().std()) > float(na[name].float().std())
        else:
            assert _bits_equal(na[name], nb[name]), name
    with pytest.raises(WeightError, match="logit_scale"):
        synthetic_weights(SMALL, 1, logit_scale=0.0)


def test_norm_weights_are_around_one():
    w = synthetic_weights(SMALL, 2)
    for t in (w.norm, w.layers[0].input_layernorm, w.layers[1].q_norm, w.layers[1].k_norm):
        assert abs(float(t.float().mean()) - 1) < float(t.float().std())  # mean within one std of 1
        assert not bool((t == 1).all())


def test_tied_embeddings_share_one_tensor():
    cfg = dataclasses.replace(SMALL, tie_word_embeddings=True)
    w = synthetic_weights(cfg, 0, logit_scale=2.0)
    assert w.lm_head is w.embed_tokens
    assert "lm_head.weight" not in dict(w.named_tensors())


def test_loader_round_trip(tmp_path):
    w = synthetic_weights(SMALL, 5, logit_scale=3.0)
    save_checkpoint(w, tmp_path)
    back = load_checkpoint(tmp_path)
    assert back.config == SMALL
    assert _same_weights(w, back)
    assert back.provenance["kind"] == "checkpoint"
    up = back.upcast()
    assert up.dtype == torch.float32 and torch.equal(up.layers[0].q_proj, back.layers[0].q_proj.float())


def test_saving_onto_a_file_is_a_weight_error(tmp_path):
    """A path that is a file gets WeightError naming it (it was a bare FileExistsError). Control: a
    fresh directory path saves."""
    w = synthetic_weights(SMALL, 5)
    f = tmp_path / "ckpt"
    f.write_text("not a directory")
    with pytest.raises(WeightError, match="not a directory"):
        save_checkpoint(w, f)
    assert (save_checkpoint(w, tmp_path / "fresh") / "model.safetensors").is_file()


def test_loader_sharded_with_index(tmp_path):
    w = synthetic_weights(SMALL, 5)
    SMALL.write_json(tmp_path / "config.json")
    names = [n for n, _ in w.named_tensors()]
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    sd = w.state_dict()
    for fname, keys in shards.items():
        save_file({k: sd[k].contiguous() for k in keys}, str(tmp_path / fname))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _same_weights(w, load_checkpoint(tmp_path))


def _rewrite(tmp_path, mutate):
    w = synthetic_weights(SMALL, 5)
    save_checkpoint(w, tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    mutate(sd)
    save_file(sd, str(tmp_path / "model.safetensors"))


def test_missing_tensor_is_named(tmp_path):
    _rewrite(tmp_path, lambda sd: sd.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(WeightError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight: missing"):
        load_checkpoint(tmp_path)


def test_wrong_shape_is_named(tmp_path):
    def mutate(sd):
        sd["model.layers.0.mlp.up_proj.weight"] = sd["model.layers.0.mlp.up_proj.weight"][:-1].contiguous()
    _rewrite(tmp_path, mutate)
    with pytest.raises(WeightError, match=r"model\.layers\.0\.mlp\.up_proj\.weight: expected shape \[96, 64\]"):
        load_checkpoint(tmp_path)


def test_wrong_dtype_is_named(tmp_path):
    def mutate(sd):
        sd["model.norm.weight"] = sd["model.norm.weight"].float()
    _rewrite(tmp_path, mutate)
    with pytest.raises(WeightError, match=r"model\.norm\.weight: expected dtype bfloat16, got float32"):
        load_checkpoint(tmp_path)


def test_unexpected_tensor_is_named(tmp_path):
    def mutate(sd):
        sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.bfloat16)
    _rewrite(tmp_path, mutate)
    with pytest.raises(WeightError, match=r"q_proj\.bias: unexpected tensor"):
        load_checkpoint(tmp_path)


def test_config_mismatch_shows_as_shape_error(tmp_path):
    w = synthetic_weights(SMALL, 5)
    save_checkpoint(w, tmp_path)
    other = dataclasses.replace(SMALL, intermediate_size=128)
    with pytest.raises(WeightError, match=r"mlp\.(gate|up|down)_proj\.weight: expected shape"):
        load_checkpoint(tmp_path, other)


def test_not_a_directory(tmp_path):
    with pytest.raises(WeightError, match="not a checkpoint directory"):
        load_checkpoint(tmp_path / "nope")
