"""The engine model's logic: one skeleton (:mod:`.runner`), one adapter per engine.

* :mod:`.request` -- an engine-contract request (TensorRT-LLM's tensor names) as Python;
* :mod:`.runner` -- the request lifecycle every engine shares (streaming, stop words,
  cancellation, metrics) over an :class:`~.runner.EngineAdapter`;
* :mod:`.vllm` -- vLLM's ``AsyncLLM``.

Nothing here imports Triton; ``tritonforge.triton_models.engine_model`` is the Triton adapter.
"""

from tritonforge.triton_models.engine.request import (
    EngineRequest,
    StopMatcher,
    engine_outputs,
    from_word_list,
    parse_engine_inputs,
)
from tritonforge.triton_models.engine.runner import Delta, EngineAdapter, EngineRunner, Responder

__all__ = [
    "Delta",
    "EngineAdapter",
    "EngineRequest",
    "EngineRunner",
    "Responder",
    "StopMatcher",
    "engine_outputs",
    "from_word_list",
    "parse_engine_inputs",
]
