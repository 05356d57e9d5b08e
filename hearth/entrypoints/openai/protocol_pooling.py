"""Request bodies of the pooling endpoints: /v1/embeddings (OpenAI), /v1/score and /v1/rerank (vLLM / Jina),
/api/embed (Ollama). Unknown fields are ignored, as the other endpoints do."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(BaseModel):
    model: str | None = None
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # vLLM's extras
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    add_special_tokens: bool = True
    normalize: bool | None = None


class ScoreRequest(BaseModel):
    """vLLM's /v1/score: text_1 against each text_2 (1:1, 1:N or N:N); queries/documents are its newer names."""

    model: str | None = None
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class RerankRequest(BaseModel):
    """Jina's / Cohere's rerank shape, as vLLM serves it."""

    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class OllamaEmbedRequest(BaseModel):
    model: str | None = None
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(default=None, ge=1)
    keep_alive: str | int | None = None
    options: dict | None = None


class OllamaEmbeddingsRequest(BaseModel):
    """The older /api/embeddings: one prompt, one unnormalized vector."""

    model: str | None = None
    prompt: str
    keep_alive: str | int | None = None
    options: dict | None = None
