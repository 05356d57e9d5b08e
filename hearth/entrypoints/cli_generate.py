"""`hearth generate [MODEL] "prompt"` and `hearth chat MODEL` (interactive, streams to the terminal)."""
from __future__ import annotations

import argparse
import dataclasses
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from hearth.entrypoints.cli import add_engine_args

    g = sub.add_parser("generate", help="complete one prompt and print the text",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_engine_args(g, model_optional=True)  # `hearth generate "prompt"`: the bundled model, as serve and chat
    g.add_argument("prompt", help="the prompt text")
    _add_sampling_args(g)
    g.set_defaults(func=run_generate)

    c = sub.add_parser("chat", help="chat with a model in the terminal",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_engine_args(c, model_optional=True)
    c.add_argument("--system", default=None, help="system message")
    _add_sampling_args(c, max_tokens=512)
    c.set_defaults(func=run_chat)


def _add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=max_tokens, help="most tokens generated per answer")
    s.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the tokens of this much mass")
    s.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = all")
    s.add_argument("--sampling-seed", type=int, default=None,
                   help="this request's sampling seed; unset: the engine's, from --seed")


def _params(ns: argparse.Namespace):
    from hearth.sampling_params import SamplingParams

    return SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k,
                          seed=ns.sampling_seed)


def _stream(engine, request_id: str, ids: list[int], params) -> str:
    """Run one request to completion, printing text as it arrives (at most the tokens the context has left)."""
    room = engine.model_config.max_model_len - len(ids)
    if params.max_tokens is not None and 0 < room < params.max_tokens:
        params = dataclasses.replace(params, max_tokens=room)
    from hearth.engine.output_processor import OutputProcessor, run_step

    engine.add_request(request_id, ids, params)
    processor = OutputProcessor(engine.tokenizer)
    processor.add_request(request_id, ids, params)
    text = ""
    try:
        while engine.has_unfinished_requests():
            for out in run_step(engine, processor):
                if out.request_id == request_id and out.new_text:
                    sys.stdout.write(out.new_text)
                    sys.stdout.flush()
                    text += out.new_text
    except KeyboardInterrupt:
        engine.abort_request(request_id)
        print()
        raise
    sys.stdout.write("\n")
    return text


def run_generate(ns: argparse.Namespace) -> int:
    from hearth.engine.llm_engine import LLMEngine
    from hearth.entrypoints.cli import engine_args_from

    params = _params(ns)  # validate before the (slow) load
    engine = LLMEngine(engine_args_from(ns))
    _stream(engine, "generate", engine.tokenizer.encode(ns.prompt), params)
    return 0


def run_chat(ns: argparse.Namespace) -> int:
    from hearth.engine.llm_engine import LLMEngine
    from hearth.entrypoints.cli import engine_args_from

    params = _params(ns)
    engine = LLMEngine(engine_args_from(ns))
    messages: list[dict] = [{"role": "system", "content": ns.system}] if ns.system else []
    turn = 0
    print("hearth chat: type a message, an empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        try:
            reply = _stream(engine, f"chat-{turn}", ids, params)
        except KeyboardInterrupt:
            messages.pop()
            continue
        except ValueError as e:  # e.g. the conversation outgrew the context
            print(f"error: {e}", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})
        turn += 1
