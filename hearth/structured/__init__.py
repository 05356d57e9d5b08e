"""Structured output: grammar-constrained decoding (llguidance) and tool-call parsing.

params.py     StructuredOutputsParams (what a request asks for)
compiler.py   grammar text -> compiled grammar, cached; GrammarMatcher (one sequence's state and bitmask)
bitmask.py    mask prefetch in a background thread; applying masks to logits in the sampler
manager.py    the engine's hooks: compile in add_request, prefetch in step, accept in _process_token
tool_calls.py tools -> constraints for tool_choice, and parsing tool calls out of model text (full and streamed)
"""
from hearth.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
