"""Tiny random checkpoints built with transformers' own config and model classes, for parity tests."""
from __future__ import annotations

import os

import torch

VOCAB = 512
SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")


def tiny_tokenizer(vocab_size: int = VOCAB):
    """A byte-level BPE tokenizer with exactly vocab_size entries (trained on a fixed text, deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = ("The quick brown fox jumps over the lazy dog. Paris is the capital of France. "
            "hearth serves language models on CPUs, with paged attention and continuous batching. ") * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=CHATML)


def tiny_config(family: str, **overrides):
    import transformers

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config}[family]
    base.update(overrides)
    return cls(**base)


def build_checkpoint(folder: str, config, seed: int = 0, std: float = 0.08, dtype=torch.float32) -> str:
    """Save a randomly initialised HF model (and the tiny tokenizer) to folder; returns folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


def hf_greedy(folder: str, prompts: list[list[int]], steps: int, top: int = 5):
    """transformers' greedy tokens and top-k raw logprobs per step, one prompt at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    results = []
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        tokens = out.sequences[0, len(ids):].tolist()
        tops = [torch.log_softmax(lg[0].float(), -1).topk(top) for lg in out.logits]
        results.append((tokens, [(t.indices.tolist(), t.values.tolist()) for t in tops]))
    return results
