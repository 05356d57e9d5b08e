"""Blocks the decoder families share: per-layer attention kinds, fused-qkv attention with optional q/k norms, the
pre-norm decoder layer and the decoder stack, each describing itself to the decode program (program_spec).

Layer protocol: layer(positions, x, residual, meta) -> (x, residual). Pre-norm layers defer the residual add
into the next norm (residual is the running sum); layers that add it themselves return residual None.
"""
from __future__ import annotations

import torch
from torch import nn

from hearth.config import HFConfig
from hearth.kernels.decoder import DecodeProgram, LayerSpec
from hearth.layers.attention import AttentionMetadata, sdpa_min_prompt
from hearth.layers.embedding import Embedding
from hearth.layers.lora import LoRARows
from hearth.layers.qkv_attention import program_spec_of
from hearth.weights import activations, apply, dispatch


def layer_types(cfg: HFConfig, default_pattern: int | None = None) -> list[str]:
    """'sliding_attention' or 'full_attention' per layer: config `layer_types`, else a sliding pattern (every
    pattern-th layer is full, as Gemma2's 1:1 and Gemma3's 5:1), else all sliding if a window is set."""
    n = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])[:n]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or default_pattern
    if window and pattern:
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    return ["sliding_attention" if window else "full_attention"] * n


def sliding_windows(cfg: HFConfig, default_pattern: int | None = None) -> list[int | None]:
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    return [window if t == "sliding_attention" and window else None for t in layer_types(cfg, default_pattern)]


class PreNormDecoderLayer(nn.Module):
    """x -> x + attn(norm(x)) -> x + mlp(norm(x)), with HF's norm names (Llama, Qwen3, Phi3, Mixtral)."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, input_norm: nn.Module, pre_mlp_norm: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = input_norm
        self.self_attn = attn
        self.post_attention_layernorm = pre_mlp_norm
        self.mlp = mlp

    def program_spec(self) -> LayerSpec | None:
        """This layer for the whole-stack decode program (None: some part it cannot run)."""
        return layer_spec(self.self_attn, self.mlp, self.input_layernorm, self.post_attention_layernorm)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


def layer_spec(attn: nn.Module, mlp: nn.Module, norm1: nn.Module, norm2: nn.Module, post1: nn.Module | None = None,
               post2: nn.Module | None = None) -> LayerSpec | None:
    """A decoder layer's LayerSpec from its parts' own specs (None if any part has none)."""
    a, m, n1, n2 = program_spec_of(attn), program_spec_of(mlp), program_spec_of(norm1), program_spec_of(norm2)
    p1, p2 = (program_spec_of(post1), program_spec_of(post2)) if post1 is not None else (None, None)
    if a is None or m is None or n1 is None or n2 is None or any(v is None for v in m.values()) or (
            post1 is not None and (p1 is None or p2 is None)):
        return None
    return LayerSpec(**a, **m, norm1=n1, norm2=n2, post1=p1, post2=p2)


class DecoderModel(nn.Module):
    """Embedding (optionally scaled), a stack of layers, a final norm. Names match HF's `model.*`."""

    tensor_parallel = False  # set on a sharded model: layers all-reduce, so no whole-stack decode program
    # With --enable-lora: the rows each adapter gets this step (hearth.layers.lora); the decode program has no LoRA
    # deltas, so it runs only the steps that have no adapter rows.
    lora_rows: LoRARows | None = None

    def __init__(self, cfg: HFConfig, layers: list[nn.Module], norm: nn.Module,
                 embed_scale: float | None = None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.embed_scale = embed_scale

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The tokens' input embeddings, scaled as the family scales them."""
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            # NOTE: Gemma rounds the scale to the compute dtype before multiplying, as HF does.
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        return x

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """inputs_embeds: this step's input rows already embedded (an image's rows replaced), owned by this call."""
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        program = self._decode_program()
        if (program is not None and not (self.lora_rows is not None and self.lora_rows.groups)
                and program.takes(x, meta, sdpa_min_prompt() is None)):  # every layer in one C call
            # (prompt rows' rounding: activations.prompt_rows; the model's own choice first)
            int8_from = activations.int8_from(x.shape[0], program.activations)
            final = program_spec_of(self.norm)
            if final is not None:  # (x: this step's fresh embeddings, the program's to overwrite)
                return program.run(x, positions, meta, int8_from, final_norm=final, owned=True)
            x, residual = program.run(x, positions, meta, int8_from)
            return self.norm(x, residual)[0]
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, meta)
        return self.norm(x) if residual is None else self.norm(x, residual)[0]

    def _decode_program(self) -> DecodeProgram | None:
        """The layers as one C decode program (None when some layer's shape is not supported), built once the KV
        caches are bound and rebuilt if they are rebound."""
        if self.tensor_parallel:
            return None
        cached = self.__dict__.get("_program")
        # (the model runner binds every layer's cache at once: the first and last layer's identify the binding)
        caches = tuple(id(getattr(getattr(getattr(layer, "self_attn", None), "attn", None), "kv_cache", None))
                       for layer in (self.layers[0], self.layers[-1]))
        if cached is None or cached[0] != caches:
            program = DecodeProgram.build([program_spec_of(layer) for layer in self.layers], dispatch.program_rows())
            if program is not None:  # (the per-model rounding set_model_activations chose, if any)
                program.activations = next((q.activations for layer in self.layers for m in layer.modules()
                                            if (q := getattr(m, "qweight", None)) is not None), None)
                if any(getattr(m, "panels", None) is not None for layer in self.layers for m in layer.modules()):
                    program.prompt_max_rows = dispatch.program_prompt_rows(apply.dense_panels_layout())
            cached = (caches, program)
            self.__dict__["_program"] = cached
        return cached[1]


def rotary_dim(cfg: HFConfig, head_dim: int) -> int:
    """Rotated dims per head: partial_rotary_factor at the top level (older configs) or in rope_parameters."""
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    factor = cfg.get("partial_rotary_factor") or rp.get("partial_rotary_factor") or 1.0
    return int(head_dim * factor)
