"""Triton adapter of ``preprocess.Preprocessor`` (the generated preprocessing/1/model.py imports it).

With the TensorRT-LLM C++ engine it also leaves, per request id, the facts postprocessing
needs to end the stream right (``request_facts``): that engine reports no finish reason.
"""

from __future__ import annotations

from typing import Any

from tritonforge.contract import PREPROCESSING_INPUTS, EngineKind, Param, pre_output
from tritonforge.triton_models import triton_io
from tritonforge.triton_models.preprocess import Preprocessor
from tritonforge.triton_models.request_facts import FactsStore, RequestFacts

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.prepare_stub(self, args)
        _, params = triton_io.model_params(args)
        self.pre = Preprocessor.from_params(params)
        self.facts: FactsStore | None = None
        self.engine_streams = (params.get(Param.ENGINE_DECOUPLED.value) or "true").lower() == "true"
        if self.pre.settings.engine is EngineKind.TRTLLM_CPP:
            self.facts = FactsStore.for_model(args["model_repository"])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                inputs = triton_io.read_inputs(request, PREPROCESSING_INPUTS)
                outputs = self.pre.process(inputs, triton_io.request_parameters(request))
                request_id = request.request_id()
                if self.facts is not None and request_id:
                    stream = outputs.get(pre_output("streaming"))
                    streams = self.engine_streams and stream is not None and bool(stream.reshape(-1)[0])
                    self.facts.put(request_id, RequestFacts.from_preprocessed(outputs, streaming=streams))
                responses.append(triton_io.make_response(outputs))
            except Exception as exc:  # never take the model down for one request
                responses.append(triton_io.exception_response(exc, "preprocessing"))
        return responses
