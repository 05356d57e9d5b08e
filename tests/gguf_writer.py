"""Write a GGUF from a tiny HF checkpoint folder (tests/tiny_models.build_checkpoint) the way llama.cpp's
convert_hf_to_gguf.py does, with the `gguf` package's writer: per-architecture metadata keys, tensor names from
gguf's own name map, Llama q/k row permutation, Gemma norms stored as 1 + w, Phi-3's fused qkv/gate_up, and the
byte-level BPE tokenizer as tokenizer.ggml.model "gpt2" (tokens, token types, merges, special ids, chat template).

Not a general converter: it covers the tiny configs the parity tests build (no MoE, no LongRoPE, no yarn).
"""
from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType

# HF architecture -> gguf MODEL_ARCH (convert_hf_to_gguf.py's ModelBase.register table, for these families).
_ARCHS = {
    "LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA, "MistralForCausalLM": gguf.MODEL_ARCH.LLAMA,
    "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2, "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3,
    "Phi3ForCausalLM": gguf.MODEL_ARCH.PHI3, "GemmaForCausalLM": gguf.MODEL_ARCH.GEMMA,
    "Gemma2ForCausalLM": gguf.MODEL_ARCH.GEMMA2, "Gemma3ForCausalLM": gguf.MODEL_ARCH.GEMMA3,
}
_GEMMAS = (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3)
# Every 2-D weight of these tiny models has rows of a multiple of 32 elements (the Q8_0 / Q4_0 block).
_FILE_TYPE = {Q.F32: gguf.LlamaFileType.ALL_F32, Q.F16: gguf.LlamaFileType.MOSTLY_F16,
              Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
              Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1, Q.IQ4_NL: gguf.LlamaFileType.MOSTLY_IQ4_NL,
              Q.IQ4_XS: gguf.LlamaFileType.MOSTLY_IQ4_XS, Q.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0}
# llama.cpp's kvalues_iq4nl (gguf.quants dequantizes IQ4 but cannot quantize it: iq4_blocks does, simply)
_IQ4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def llama_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py LlamaModel.permute: per head, rows (2, d/2) -> (d/2, 2) (for ggml's rope)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_theta(cfg, kind: str = "full_attention", default: float = 10000.0) -> float:
    rp = getattr(cfg, "rope_parameters", None) or {}
    rp = rp.get(kind, rp) if isinstance(rp.get(kind), dict) else rp
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", default)))


def _rope_scaling(cfg) -> dict:
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rp.get("full_attention"), dict):
        rp = rp["full_attention"]
    return {} if rp.get("rope_type", "default") == "default" else rp


def _write_params(w: gguf.GGUFWriter, arch: gguf.MODEL_ARCH, cfg, qtype: Q) -> None:
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    # TextModel.set_gguf_parameters (the base every family below starts from or repeats)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(_FILE_TYPE[qtype])
    if arch in (gguf.MODEL_ARCH.LLAMA, gguf.MODEL_ARCH.QWEN2, gguf.MODEL_ARCH.QWEN3, gguf.MODEL_ARCH.GEMMA3):
        w.add_rope_freq_base(_rope_theta(cfg))
    if arch is not gguf.MODEL_ARCH.PHI3:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    rs = _rope_scaling(cfg)
    if arch is gguf.MODEL_ARCH.LLAMA:  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(head_dim)
        if rs:
            if rs["rope_type"] != "linear":
                raise NotImplementedError(f"rope {rs['rope_type']}: this test writer does linear only")
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rs["factor"])
        if getattr(cfg, "sliding_window", None):  # Mistral
            w.add_sliding_window(cfg.sliding_window)
    elif arch is gguf.MODEL_ARCH.PHI3:  # Phi3MiniModel.set_gguf_parameters
        rp = getattr(cfg, "rope_parameters", None) or {}
        rot = rp.get("partial_rotary_factor") or getattr(cfg, "partial_rotary_factor", None) or 1.0
        if rs and rs.get("rope_type") not in (None, "default"):
            raise NotImplementedError("Phi-3 LongRoPE: this test writer does not write rope_factors_*")
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        w.add_rope_dimension_count(int(rot * cfg.hidden_size) // heads)
        w.add_rope_freq_base(_rope_theta(cfg))
        w.add_sliding_window(getattr(cfg, "sliding_window", None) or 0)  # 0: no window (llama.cpp's Phi-4 marker)
    elif arch is gguf.MODEL_ARCH.GEMMA2:
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    elif arch is gguf.MODEL_ARCH.GEMMA3:
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    if arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3) and cfg.query_pre_attn_scalar != head_dim:
        # llama.cpp scales queries by 1/sqrt(head_dim) (27B: hidden/heads); GGUF has no key for anything else.
        raise ValueError(f"query_pre_attn_scalar {cfg.query_pre_attn_scalar} != head_dim {head_dim}: "
                         "not representable in GGUF")


def _write_vocab(w: gguf.GGUFWriter, folder: str, vocab_size: int) -> None:
    """convert_hf_to_gguf.py TextModel._set_vocab_gpt2 / get_vocab_base, for a byte-level BPE tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added = tok.get_added_vocab()
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif reverse[i] in added:
            tokens.append(reverse[i])
            special = tok.added_tokens_decoder[i].special
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # the tiny tokenizer's pre-tokenizer is plain GPT-2 ByteLevel
    w.add_token_list(tokens)
    w.add_token_types(types)
    # merges, bos/eos/unk/pad ids, add_*_token flags and the chat template (chat_template.jinja)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w)


def _hf_tensors(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


def _iq4_nearest(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Indices of the kvalues nearest to w / scale ([..., 32] and [..., 1]), nibble-packed as ggml stores a block
    (byte l: element l low, element l + 16 high)."""
    idx = np.abs(w[..., None] - scale[..., None] * _IQ4).argmin(-1).astype(np.uint8)
    return idx[..., :16] | (idx[..., 16:] << 4)


def iq4_blocks(a: np.ndarray, qtype: Q) -> np.ndarray:
    """fp32 [N, K] -> IQ4_NL (K % 32) or IQ4_XS (K % 256) rows, uint8 [N, row bytes]: the block scale puts the
    value of largest magnitude on kvalue -127 (llama.cpp's starting point, without its scale search)."""
    n, k = a.shape
    sub = a.reshape(n, -1, 32)
    peak = np.take_along_axis(sub, np.abs(sub).argmax(-1)[..., None], -1)  # [N, blocks, 1] signed
    if qtype == Q.IQ4_NL:
        d = (peak / -127.0).astype(np.float16)
        out = np.concatenate([d.view(np.uint8), _iq4_nearest(sub, d.astype(np.float32))], -1)
        return out.reshape(n, -1)
    s = (peak / -127.0).reshape(n, -1, 8)  # wanted per-32 scales [N, super-blocks, 8]
    d = (np.abs(s).max(-1, keepdims=True) / 31.0).astype(np.float16)
    df = d.astype(np.float32)
    ls = (np.round(np.divide(s, df, out=np.zeros_like(s), where=df != 0)) + 32).clip(0, 63).astype(np.uint16)
    high = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(-1, dtype=np.uint16)[..., None]
    low = (ls & 15).astype(np.uint8).reshape(n, -1, 4, 2)
    qs = _iq4_nearest(sub.reshape(n, -1, 8, 32), (df * (ls.astype(np.float32) - 32))[..., None])
    out = np.concatenate([d.view(np.uint8), high.view(np.uint8), low[..., 0] | (low[..., 1] << 4),
                          qs.reshape(n, -1, 128)], -1)
    return out.reshape(n, -1)


def _encode(t: torch.Tensor, qtype: Q) -> tuple[np.ndarray, Q]:
    """(array to write, its ggml type): 1-D tensors stay F32 (norms, biases), as convert_hf_to_gguf.py keeps them."""
    a = t.float().numpy()
    if a.ndim == 1 or qtype == Q.F32:
        return a, Q.F32
    if qtype == Q.F16:
        return a.astype(np.float16), Q.F16
    if qtype == Q.IQ4_XS and a.shape[1] % 256:  # llama-quantize's fallback for rows IQ4_XS cannot hold
        qtype = Q.IQ4_NL
    if qtype in (Q.IQ4_NL, Q.IQ4_XS):
        return iq4_blocks(a, qtype), qtype
    return gguf.quants.quantize(a, qtype), qtype


def write_gguf(folder: str | os.PathLike, path: str | os.PathLike, qtype: Q = Q.F32,
               types: dict[str, Q] | None = None) -> dict[str, torch.Tensor]:
    """Write `path` from the HF checkpoint in `folder`. Returns the HF-named fp32 weights exactly as the file
    holds them once decoded (qtype round trip applied, permutation and norm shift undone): the checkpoint a
    reference model should run to see the same numbers as a correct GGUF loader. types: another type for the
    tensors whose HF name contains a key (a llama-quantize mix, e.g. {"v_proj": Q.Q8_0})."""
    from transformers import AutoConfig

    folder, path = os.fspath(folder), os.fspath(path)
    cfg = AutoConfig.from_pretrained(folder)
    arch = _ARCHS[cfg.architectures[0]]
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads

    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(Path(folder).name)
    _write_params(w, arch, cfg, qtype)
    _write_vocab(w, folder, cfg.vocab_size)

    decoded: dict[str, torch.Tensor] = {}
    for hf_name, t in _hf_tensors(folder).items():
        if arch in (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2) and hf_name == "lm_head.weight":
            continue  # GemmaModel.filter_tensors: llama.cpp ties Gemma 1/2 output to the embedding
        t = t.float()
        shift = 1.0 if arch in _GEMMAS and hf_name.endswith("norm.weight") else 0.0
        if arch is gguf.MODEL_ARCH.LLAMA and ".q_proj." in hf_name:
            t = llama_permute(t, heads)
        elif arch is gguf.MODEL_ARCH.LLAMA and ".k_proj." in hf_name:
            t = llama_permute(t, kv)
        t = t + shift  # Gemma*RMSNorm multiplies by (1 + w); llama.cpp stores the sum
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"{hf_name}: no GGUF name for {gguf.MODEL_ARCH_NAMES[arch]}")
        data, dtype = _encode(t, next((q for key, q in (types or {}).items() if key in hf_name), qtype))
        w.add_tensor(gguf_name, data, raw_dtype=None if dtype in (Q.F32, Q.F16) else dtype)
        back = torch.from_numpy(np.ascontiguousarray(
            gguf.quants.dequantize(data, dtype) if dtype not in (Q.F32, Q.F16) else data.astype(np.float32)))
        back = back.reshape(t.shape) - shift
        if arch is gguf.MODEL_ARCH.LLAMA and ".q_proj." in hf_name:
            back = _unpermute(back, heads)
        elif arch is gguf.MODEL_ARCH.LLAMA and ".k_proj." in hf_name:
            back = _unpermute(back, kv)
        decoded[hf_name] = back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return decoded


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
