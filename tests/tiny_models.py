"""Tiny random checkpoints built with transformers' own config and model classes, for parity tests."""
from __future__ import annotations

import math

import os

import torch

VOCAB = 512
SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")


def tiny_tokenizer(vocab_size: int = VOCAB, extra_special: tuple[str, ...] = (), extra_added: tuple[str, ...] = (),
                   chat_template: str = CHATML):
    """A byte-level BPE tokenizer with exactly vocab_size entries (trained on a fixed text, deterministic).
    extra_special are more special tokens; extra_added are added tokens that decode as text (as Qwen3's <think>)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = ("The quick brown fox jumps over the lazy dog. Paris is the capital of France. "
            "hearth serves language models on CPUs, with paged attention and continuous batching. ") * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size - len(extra_added),
                                                        special_tokens=SPECIALS + list(extra_special),
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    if extra_added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra_added])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=chat_template)


def large_vocab_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE tokenizer with vocab_size entries built from random merges (no training: fast), for what
    a real model's large vocabulary costs the server (its tokenizer's memory), not for what it encodes."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIALS + alphabet)}
    tokens, merges, rng = list(alphabet), [], random.Random(seed)
    while len(vocab) < vocab_size:
        left, right = rng.choice(tokens), rng.choice(alphabet)
        if len(left) < 12 and left + right not in vocab:
            merges.append((left, right))
            vocab[left + right] = len(vocab)
            tokens.append(left + right)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=CHATML)


# family -> (transformers config class name, defaults that keep it tiny). Head dims are set explicitly because
# several families default to 128 or 256.
_FAMILY_DEFAULTS: dict[str, tuple[str, dict]] = {
    "qwen3": ("Qwen3Config", dict(head_dim=16)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=16, moe_intermediate_size=32, num_experts=4,
                                          num_experts_per_tok=2)),
    "gemma": ("GemmaConfig", dict(head_dim=16, pad_token_id=2)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, pad_token_id=2, query_pre_attn_scalar=24, sliding_window=16)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, pad_token_id=2, query_pre_attn_scalar=24, sliding_window=16,
                                        num_hidden_layers=6)),
    "phi3": ("Phi3Config", dict(pad_token_id=2)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "stablelm": ("StableLmConfig", dict(pad_token_id=2)),
    "olmo": ("OlmoConfig", dict(pad_token_id=2)),
    "olmo2": ("Olmo2Config", dict(pad_token_id=2)),
}


def _family_configs() -> dict:
    import transformers

    return {k: (getattr(transformers, cls), d) for k, (cls, d) in _FAMILY_DEFAULTS.items()}


def tiny_config(family: str, **overrides):
    import transformers

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, **_family_configs()}[family]
    if isinstance(cls, tuple):  # (config class, family defaults that make it tiny)
        cls, defaults = cls
        base.update(defaults)
    base.update(overrides)
    return cls(**base)


def build_checkpoint(folder: str, config, seed: int = 0, std: float = 0.08, dtype=torch.float32,
                     tokenizer=None) -> str:
    """Save a randomly initialised HF model (and the tiny tokenizer, or the one given) to folder; returns folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 or name.endswith("bias"):  # biases too: HF inits them to zero, which tests nothing
                p.normal_(0.0, std)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    (tokenizer or tiny_tokenizer(config.vocab_size)).save_pretrained(folder)
    return folder


def hf_greedy_loop(model, ids: list[int], steps: int, top: int = 5):
    """Plain greedy decoding with transformers' forward pass and its KV cache. No logits processors: eos is an
    ordinary token here, as it is for hearth with ignore_eos."""
    tokens, tops, past = [], [], None
    inp = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            out = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logprobs = torch.log_softmax(out.logits[0, -1].float(), -1)
            t = logprobs.topk(top)
            tops.append((t.indices.tolist(), t.values.tolist()))
            nxt = int(logprobs.argmax())
            tokens.append(nxt)
            inp = torch.tensor([[nxt]])
    return tokens, tops


def hf_greedy(folder: str, prompts: list[list[int]], steps: int, top: int = 5):
    """transformers' greedy tokens and top-k raw logprobs per step, one prompt at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return [hf_greedy_loop(model, ids, steps, top) for ids in prompts]


def baichuan_alibi_slopes(n: int) -> list[float]:
    """Baichuan-13B's _get_interleave (its ALiBi slopes), transcribed: the reference for hearth's slopes."""
    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + baichuan_alibi_slopes(2 * closest)[0::2][: n - closest]
