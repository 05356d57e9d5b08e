"""Ollama's API (the part desktop tools and the `ollama` client use), over hearth's chat and completion paths."""
