"""Baichuan 2 7B (W_pack, NormHead) vs transformers' Llama running the same weights unpacked.

transformers has no Baichuan class (the checkpoints ship remote code, which is never run): the test builds a
tiny Llama, repacks it as a Baichuan checkpoint (with auto_map, as the real ones have), and compares hearth on
it with transformers' Llama given the normalized lm_head.
"""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.models.parity import PARITY_PROMPTS, assert_greedy_parity
from tests.tiny_models import build_checkpoint, hf_greedy, tiny_config


def _repack_as_baichuan(llama_dir: str, out_dir: str, norm_head: bool) -> None:
    with open(os.path.join(llama_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_file(os.path.join(llama_dir, "model.safetensors"))
    packed: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            parts = [tensors[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            packed[name.replace("q_proj", "W_pack")] = torch.cat(parts).contiguous()
        else:
            packed[name] = t
    if norm_head:  # unnormalized rows in the checkpoint, so skipping the normalization would show
        torch.manual_seed(1)
        packed["lm_head.weight"] = packed["lm_head.weight"] * torch.rand(cfg["vocab_size"], 1).add(0.5)
    shutil.copytree(llama_dir, out_dir)
    os.remove(os.path.join(out_dir, "model.safetensors"))
    save_file(packed, os.path.join(out_dir, "model.safetensors"))
    bc = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "max_position_embeddings", "rms_norm_eps", "hidden_act",
                              "bos_token_id", "eos_token_id", "tie_word_embeddings")}
    bc.update(architectures=["BaichuanForCausalLM"], model_type="baichuan", norm_head=norm_head,
              auto_map={"AutoConfig": "configuration_baichuan.BaichuanConfig",
                        "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(bc, f)
    if norm_head:  # the reference Llama sees what NormHead computes
        ref = load_file(os.path.join(llama_dir, "model.safetensors"))
        ref["lm_head.weight"] = torch.nn.functional.normalize(packed["lm_head.weight"], dim=-1)
        save_file(ref, os.path.join(llama_dir, "model.safetensors"))


@pytest.mark.parametrize("norm_head", [True, False], ids=["baichuan2-7b", "baichuan-7b"])
def test_greedy_parity_against_llama(norm_head: bool, tmp_path) -> None:
    llama_dir = build_checkpoint(str(tmp_path / "llama"), tiny_config("llama", num_key_value_heads=4))
    baichuan_dir = str(tmp_path / "baichuan")
    _repack_as_baichuan(llama_dir, baichuan_dir, norm_head)
    assert_greedy_parity(baichuan_dir, expected=hf_greedy(llama_dir, PARITY_PROMPTS, 32))
