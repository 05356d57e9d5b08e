"""LoRA adapters: the request that names one (request.py, vLLM's LoRARequest) and reading a PEFT adapter folder
(peft.py). Applying them is hearth.layers.lora's; pooling and binding them to a model, hearth.engine.lora_pool's."""
