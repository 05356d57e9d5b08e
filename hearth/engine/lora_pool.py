"""The adapters one engine serves, bounded twice (vLLM's LoRA manager, cut down to CPUs):

- registered: every adapter a request may name, by id (its LoRARequest: name and folder);
- loaded: read, checked and bound to the model's layers; at most max_cpu_loras, least recently used dropped first
  (it is read again from its folder when a request names it next). An adapter a request in flight uses is never
  dropped, so a step never reads a file;
- active: in one of the layers' max_loras slots. The scheduler admits at most max_loras distinct adapters among the
  running requests, so a step's adapters always fit; a slot whose adapter this step does not use is taken by the
  least recently used.

Each step the runner asks for its row groups: per slot (and scale), the rows of the requests under that slot's
adapter.
Engine-thread only, except read(), which touches no state (the server reads a new adapter off the engine thread).
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from hearth.config import LoRAConfig
from hearth.engine.lora_binding import bind_adapter
from hearth.errors import LoRAError
from hearth.layers.lora import RowGroup, SlotWeights, wrap_lora_layers
from hearth.loader.lora_adapter import read_adapter
from hearth.lora.request import LoRARequest
from hearth.models.blocks import DecoderModel

AdapterWeights = dict[str, SlotWeights]  # wrapped layer name -> this adapter's weights there


class LoRAPool:
    def __init__(self, model: nn.Module, config: LoRAConfig, dtype: torch.dtype) -> None:
        self.model, self.config, self.dtype = model, config, dtype
        self.rows, self.layers = wrap_lora_layers(model, config.max_loras)
        if not self.layers:
            raise ValueError(f"--enable-lora: {type(model).__name__} has no attention or MLP projections an adapter "
                             "can train")
        for m in model.modules():
            if isinstance(m, DecoderModel):
                m.lora_rows = self.rows
        self.registered: dict[int, LoRARequest] = {}
        # id -> (the adapter, its weights), least recently used first
        self.loaded: OrderedDict[int, tuple[LoRARequest, AdapterWeights]] = OrderedDict()
        self.users: dict[int, int] = {}  # adapter id -> requests in flight under it
        self.holder: dict[str, int] = {}  # request id -> the adapter id it holds
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # active adapter id -> slot, least recently used first

    # ---- adapters ----
    def read(self, lora: LoRARequest) -> AdapterWeights:
        """Read and check an adapter (a PEFT folder or a GGUF file) and bind it to the model (no pool state
        changes). Raises LoRAError."""
        adapter = read_adapter(lora.lora_path, self.config.max_lora_rank, self.model)
        return bind_adapter(adapter, self.model, self.layers, self.dtype)

    def add(self, lora: LoRARequest, weights: AdapterWeights | None = None) -> None:
        """Register an adapter and load it (weights: read() already did). Raises LoRAError; an id already taken by
        another adapter is one."""
        lora_id = lora.lora_int_id
        known = self.registered.get(lora_id) or (self.loaded[lora_id][0] if lora_id in self.loaded else None)
        if known is not None and (known.lora_name, known.lora_path) != (lora.lora_name, lora.lora_path):
            raise LoRAError(f"LoRA adapter id {lora_id} is already {known.lora_name!r} ({known.lora_path}); give "
                            f"{lora.lora_name!r} another id")
        if lora_id in self.loaded:
            self.loaded.move_to_end(lora_id)
        else:
            self.loaded[lora_id] = (lora, weights if weights is not None else self.read(lora))
            self._evict(keep=lora_id)
        self.registered[lora_id] = lora

    def remove(self, lora_id: int) -> bool:
        """Forget an adapter (False: it was not registered). Requests in flight under it finish under it."""
        if self.registered.pop(lora_id, None) is None:
            return False
        if not self.users.get(lora_id):
            self._drop(lora_id)
        return True

    def acquire(self, request_id: str, lora: LoRARequest) -> None:
        """A request under `lora` is admitted: register and load it if needed, and keep it loaded until release()."""
        self.add(lora)
        self.holder[request_id] = lora.lora_int_id
        self.users[lora.lora_int_id] = self.users.get(lora.lora_int_id, 0) + 1

    def release(self, request_id: str) -> None:
        """The request has finished (idempotent; a request that held nothing is ignored)."""
        lora_id = self.holder.pop(request_id, None)
        if lora_id is None:
            return
        self.users[lora_id] -= 1
        if self.users[lora_id] == 0:
            del self.users[lora_id]
            if lora_id not in self.registered:  # removed while in use
                self._drop(lora_id)
            else:
                self._evict()

    def _evict(self, keep: int | None = None) -> None:
        """Drop least recently used adapters no request uses (nor `keep`) while more than max_cpu_loras are
        loaded."""
        idle = [i for i in self.loaded if not self.users.get(i) and i != keep]
        while len(self.loaded) > self.config.max_cpu_loras and idle:
            self._drop(idle.pop(0))

    def _drop(self, lora_id: int) -> None:
        self.loaded.pop(lora_id, None)
        slot = self.slot_of.pop(lora_id, None)
        if slot is not None:
            self._fill(slot, None)

    # ---- a step ----
    def row_groups(self, spans: list[tuple[int, float, int]]) -> list[RowGroup]:
        """spans: (adapter id, its scale, rows) of each request in the step's row order (id 0: the base model).
        Returns the rows of each (active slot, scale), after putting this step's adapters into slots."""
        rows_of: dict[tuple[int, float], list[tuple[int, int]]] = {}
        start = 0
        for lora_id, scale, n in spans:
            if lora_id:
                ranges = rows_of.setdefault((lora_id, scale), [])
                if ranges and ranges[-1][1] == start:
                    ranges[-1] = (ranges[-1][0], start + n)
                else:
                    ranges.append((start, start + n))
            start += n
        in_step = {lora_id for lora_id, _ in rows_of}
        groups = []
        for (lora_id, scale), ranges in rows_of.items():
            slot = self._activate(lora_id, in_step)
            if len(ranges) == 1:
                groups.append((slot, slice(*ranges[0]), scale))
            else:
                groups.append((slot, torch.cat([torch.arange(a, b) for a, b in ranges]), scale))
        return groups

    def _activate(self, lora_id: int, step: set[int]) -> int:
        slot = self.slot_of.get(lora_id)
        if slot is not None:
            self.slot_of.move_to_end(lora_id)
            return slot
        used = set(self.slot_of.values())
        free = [s for s in range(self.config.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:  # NOTE: the scheduler keeps a step's adapters within max_loras, so an idle slot exists
            victim = next(i for i in self.slot_of if i not in step)
            slot = self.slot_of.pop(victim)
        if lora_id not in self.loaded:  # (acquire keeps a running request's adapter loaded)
            raise RuntimeError(f"LoRA adapter id {lora_id} is in a step but not loaded")
        self._fill(slot, self.loaded[lora_id][1])
        self.slot_of[lora_id] = slot
        return slot

    def _fill(self, slot: int, weights: AdapterWeights | None) -> None:
        for name, layer in self.layers.items():
            layer.slots[slot] = None if weights is None else weights.get(name)

    def summary(self) -> str:
        c = self.config
        return (f"LoRA: {len(self.layers)} projections take adapters; {c.max_loras} per step, up to "
                f"{c.max_cpu_loras} loaded, rank <= {c.max_lora_rank}")
