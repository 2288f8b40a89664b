"""Stand-in for ``tensorrt_llm.sampling_params`` (see the package docstring): not TensorRT-LLM.

``SamplingParams`` and ``GuidedDecodingParams`` with the names, defaults and checks of
TensorRT-LLM's own ``tensorrt_llm/sampling_params.py`` for the fields this stand-in honours;
constructing either with any other keyword raises ``TypeError`` (both are keyword-only
dataclasses upstream too).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["GuidedDecodingParams", "SamplingParams"]


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    """Guided decoding parameters: only one of the fields may be set (as upstream's)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        num_guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if num_guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num_guides}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    """The fields of ``tensorrt_llm.SamplingParams`` this stand-in honours (same names,
    same defaults)."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    best_of: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    logprobs: int | None = None
    exclude_input_from_output: bool = True
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (greedy is top_k=1); got {self.temperature}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1; got {self.max_tokens}")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
