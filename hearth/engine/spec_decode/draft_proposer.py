"""Draft-model proposals: a small model of the same vocabulary guesses the next k tokens.

Greedy requests get the draft's argmax. Randomly sampled ones draw from the draft's own distribution q (same
temperature, top-k/top-p/min-p, the request's generator) and hand q to verification, whose min(1, p/q) test then
keeps the target's distribution exact.

The draft has its own KV cache tensors with the target's num_blocks and block_size, addressed through the
target's block tables (same slots, so no second block manager). Each request remembers how many of its tokens
the draft has in cache (num_draft_computed); before proposing, the draft catches up on the rest (a prompt chunk
the first time, then the last step's accepted tokens) in one batched pass, then runs k - 1 batched decode steps.
"""
from __future__ import annotations

import torch
from torch import nn

from hearth.config import EngineArgs, ModelConfig
from hearth.engine.input_batch import SeqInput, prepare_inputs
from hearth.engine.model_runner import ModelRunner
from hearth.engine.request import Request
from hearth.layers.sampler import Sampler
from hearth.sampling_params import SamplingType


class DraftProposer:
    def __init__(self, model: nn.Module, num_blocks: int, block_size: int, kv_dtype: torch.dtype,
                 vocab_size: int, sampler: Sampler) -> None:
        self.runner = ModelRunner(model, num_blocks, block_size, kv_dtype, vocab_size)  # owns the draft's KV
        self.sampler = sampler  # the target's: seeded requests draw from their one generator
        self.model = model
        self.block_size = block_size
        self.vocab_size = vocab_size

    @torch.inference_mode()
    def propose(self, reqs: list[Request], tables: list[list[int]],
                ks: list[int]) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """ks[i] (>= 1) draft tokens for reqs[i], and for a randomly sampled request the draft's distributions
        ([ks[i], V]; None for greedy). Its table must already cover positions up to num_tokens + ks[i] - 2 (the
        scheduler allocated them for verification)."""
        # 1. Catch up on the tokens the draft lacks (at least the last one); its last logits give draft token 1.
        seqs = [SeqInput(r.all_token_ids[r.num_draft_computed:], r.num_draft_computed, t) for r, t in zip(reqs, tables)]
        order = sorted(range(len(reqs)), key=lambda i: not seqs[i].is_decode)
        drafts: list[list[int]] = [[] for _ in reqs]
        probs: list[list[torch.Tensor]] = [[] for _ in reqs]
        last_rows, offset = [], 0
        for i in order:
            offset += len(seqs[i].token_ids)
            last_rows.append(offset - 1)
        for i, (tok, q) in zip(order, self._next([seqs[i] for i in order], last_rows, [reqs[i] for i in order])):
            drafts[i].append(tok)
            if q is not None:
                probs[i].append(q)
            reqs[i].num_draft_computed = reqs[i].num_tokens
        # 2. Then one batched decode step per further draft token.
        for j in range(1, max(ks)):
            active = [i for i in range(len(reqs)) if ks[i] > j]
            step = [SeqInput([drafts[i][-1]], reqs[i].num_tokens + j - 1, tables[i]) for i in active]
            for i, (tok, q) in zip(active, self._next(step, list(range(len(active))), [reqs[i] for i in active])):
                drafts[i].append(tok)
                if q is not None:
                    probs[i].append(q)
                reqs[i].num_draft_computed += 1
        return drafts, [torch.stack(q) if q else None for q in probs]

    def _next(self, seqs: list[SeqInput], rows: list[int],
              reqs: list[Request]) -> list[tuple[int, torch.Tensor | None]]:
        """One forward pass; the next draft token of each sequence (and q for randomly sampled ones)."""
        input_ids, positions, meta = prepare_inputs(seqs, self.block_size)
        hidden = self.model(input_ids, positions, meta)  # [T, hidden]
        logits = self.model.compute_logits(hidden[rows])[:, : self.vocab_size]
        logits = self.sampler.apply_processors(logits.clone(), reqs)  # history-free ones only (see speculator)
        tokens = logits.argmax(dim=-1).tolist()
        qs: list[torch.Tensor | None] = [None] * len(reqs)
        rand = [i for i, r in enumerate(reqs) if r.params.sampling_type != SamplingType.GREEDY]
        if rand:
            probs = self.sampler.probs(logits[rand], [reqs[i] for i in rand])  # [R, V]
            for j, i in enumerate(rand):
                tokens[i] = int(torch.multinomial(probs[j], 1, generator=self.sampler.generator_for(reqs[i])))
                qs[i] = probs[j]
        return list(zip(tokens, qs))


def load_draft_model(args: EngineArgs, path: str, target: ModelConfig) -> tuple[nn.Module, ModelConfig]:
    """Load the draft (HF folder or .gguf) with the target's engine args (dtype, quantization, max_model_len).
    Raises ValueError when its vocabulary differs from the target's."""
    import dataclasses

    from hearth.loader.model_loader import load_model

    draft_args = dataclasses.replace(args, model=path, tokenizer=None, max_model_len=target.max_model_len,
                                     speculative_config=None, served_model_name=None)
    loaded = load_model(draft_args)
    if loaded.model_config.vocab_size != target.vocab_size:
        raise ValueError(f"the draft model {path} has a vocabulary of {loaded.model_config.vocab_size} tokens, "
                         f"the target's has {target.vocab_size}: use a draft from the same model family (same "
                         "tokenizer)")
    return loaded.model, loaded.model_config
