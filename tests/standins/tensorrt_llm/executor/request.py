"""Stand-in for ``tensorrt_llm.executor.request`` (see the package docstring): not
TensorRT-LLM. ``LoRARequest`` has the fields and checks of TensorRT-LLM's own."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["LoRARequest"]


@dataclass(slots=True)
class LoRARequest:
    """Request for a LoRA adapter."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if self.lora_path is not None and not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")
        if self.lora_ckpt_source not in ("hf", "nemo"):
            raise ValueError(f"lora_ckpt_source must be 'hf' or 'nemo', got '{self.lora_ckpt_source}'")
