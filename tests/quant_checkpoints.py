"""Pre-quantized checkpoints written from each format's specification (GPTQ, AWQ, compressed-tensors), for tests.

Each writer takes integer codes q [N, K], zeros z [N, G] and 16-bit scales s [N, G] and packs them the way the
format's own tools do; `reference` is the format's dequantization, (q - z) * s in fp32, written independently of
hearth's unpacking. `write_folder` turns a float tiny checkpoint into a quantized one plus its dequantized twin.
"""
from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's pack order: nibble i of a word holds column 8c + AWQ_ORDER[i]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _to_i32(v: torch.Tensor) -> torch.Tensor:
    v = v & 0xFFFFFFFF
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def pack_along_rows(v: torch.Tensor, bits: int) -> torch.Tensor:
    """int [R, C] -> int32 [R * bits / 32, C]: word i holds rows i*p .. i*p+p-1, row i*p+j at bits*j."""
    p = 32 // bits
    v = v.to(torch.int64).reshape(-1, p, v.shape[1])
    return _to_i32(sum(v[:, j] << (bits * j) for j in range(p)))


def pack_along_cols(v: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    p = 32 // bits
    v = v.to(torch.int64).reshape(v.shape[0], -1, p)
    order = order or tuple(range(p))
    return _to_i32(sum(v[:, :, order[j]] << (bits * j) for j in range(p)))


def codes(n: int, k: int, bits: int, group: int, sym: bool, gen: torch.Generator, w: torch.Tensor | None = None,
          g_idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K], z [N, G], s fp16 [N, G], g_idx [K]): random codes over the full range (w None), or w's rounding."""
    g_idx = torch.arange(k) // group if g_idx is None else g_idx
    groups, top = k // group, (1 << bits) - 1
    if w is None:
        q = torch.randint(0, top + 1, (n, k), generator=gen)
        z = torch.full((n, groups), 1 << (bits - 1)) if sym else torch.randint(0, top + 1, (n, groups), generator=gen)
        s = (torch.rand(n, groups, generator=gen) * 0.02 + 1e-3).half()
        return q, z, s, g_idx
    lo = torch.stack([w[:, g_idx == g].amin(1) for g in range(groups)], 1).clamp(max=0)
    hi = torch.stack([w[:, g_idx == g].amax(1) for g in range(groups)], 1).clamp(min=0)
    if sym:
        s = (torch.maximum(hi, -lo) * 2 / top).half()
        z = torch.full((n, groups), 1 << (bits - 1))
    else:
        s = ((hi - lo) / top).half()
        z = torch.round(-lo / s.float()).clamp(0, top).long()
    sc, zc = s.float()[:, g_idx], z[:, g_idx]
    q = (torch.round(w / sc) + zc).clamp(0, top).long()
    return q, z, s, g_idx


def reference(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """The formats' dequantization: w[n, k] = (q[n, k] - z[n, g_idx[k]]) * s[n, g_idx[k]], fp32."""
    return (q - z[:, g_idx]).float() * s.float()[:, g_idx]


def gptq_tensors(q, z, s, g_idx, bits: int, v1: bool = True) -> dict[str, torch.Tensor]:
    zs = (z - 1) & ((1 << bits) - 1) if v1 else z
    return {"qweight": pack_along_rows(q.t(), bits), "qzeros": pack_along_cols(zs.t(), bits),
            "scales": s.t().contiguous(), "g_idx": g_idx.to(torch.int32)}


def awq_tensors(q, z, s) -> dict[str, torch.Tensor]:
    return {"qweight": pack_along_cols(q.t(), 4, AWQ_ORDER), "qzeros": pack_along_cols(z.t(), 4, AWQ_ORDER),
            "scales": s.t().contiguous()}


def ct_tensors(q, z, s, bits: int, sym: bool) -> dict[str, torch.Tensor]:
    """compressed-tensors, packed by the compressed-tensors package itself (its values are signed)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    off = 1 << (bits - 1)
    scale = s.to(torch.bfloat16) if s.dtype == torch.bfloat16 else s
    if bits == 8:
        return {"weight": (q - off).to(torch.int8), "weight_scale": scale}
    out = {"weight_packed": pack_to_int32((q - off).to(torch.int8), bits), "weight_scale": scale,
           "weight_shape": torch.tensor(list(q.shape))}
    if not sym:
        out["weight_zero_point"] = pack_to_int32((z - off).to(torch.int8), bits, packed_dim=0)
    return out


def quant_config(method: str, bits: int, group: int, sym: bool, desc_act: bool = False, v1: bool = True) -> dict:
    if method == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym,
                "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    weights = {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": "channel" if group == -1 else "group",
               "group_size": None if group == -1 else group}
    act = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"} if bits == 8 else None
    return {"quant_method": "compressed-tensors", "format": "int-quantized" if bits == 8 else "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act}},
            "ignore": ["lm_head"], "quantization_status": "compressed"}


def write_folder(src: str, out: str, deq: str, method: str, bits: int, group: int, sym: bool,
                 desc_act: bool = False, v1: bool = True, seed: int = 0) -> None:
    """src (a float tiny checkpoint) -> out (its linears in `method`) and deq (the same model, dequantized, fp32)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    quant, dense = {}, {}
    perms: dict[tuple[str, str], torch.Tensor] = {}
    for name, w in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        proj = prefix.rsplit(".", 1)[-1]
        if proj not in LINEARS or leaf != "weight":
            quant[name] = dense[name] = w
            continue
        n, k = w.shape
        g = k if group == -1 else group
        g_idx = None
        if desc_act:  # one act order per layer input, shared by the projections that read it (q/k/v, gate/up)
            key = (prefix.rsplit(".", 2)[0], {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}
                   .get(proj, proj))
            perm = perms.setdefault(key, torch.randperm(k, generator=gen))
            g_idx = torch.empty(k, dtype=torch.long)
            g_idx[perm] = torch.arange(k) // g
        q, z, s, g_idx = codes(n, k, bits, g, sym, gen, w.float(), g_idx)
        if method == "compressed-tensors":
            s = s.to(torch.bfloat16)  # (llm-compressor stores scales in the model's dtype)
        dense[name] = reference(q, z, s, g_idx)
        parts = (gptq_tensors(q, z, s, g_idx, bits, v1) if method == "gptq" else awq_tensors(q, z, s)
                 if method == "awq" else ct_tensors(q, z, s, bits, sym))
        quant.update({f"{prefix}.{key}": t for key, t in parts.items()})
    for folder, ts in ((out, quant), (deq, dense)):
        os.makedirs(folder, exist_ok=True)
        for f in os.listdir(src):
            if not f.endswith(".safetensors"):
                shutil.copy(os.path.join(src, f), folder)
        save_file({k: v.contiguous() for k, v in ts.items()}, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quant_config(method, bits, group, sym, desc_act, v1)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
