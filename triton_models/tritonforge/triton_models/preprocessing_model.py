"""Triton adapter of ``preprocess.Preprocessor`` (the generated preprocessing/1/model.py imports it)."""

from __future__ import annotations

from typing import Any

from tritonforge.contract import PREPROCESSING_INPUTS
from tritonforge.triton_models import triton_io
from tritonforge.triton_models.preprocess import Preprocessor

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.prepare_stub()
        _, params = triton_io.model_params(args)
        self.pre = Preprocessor.from_params(params)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                inputs = triton_io.read_inputs(request, PREPROCESSING_INPUTS)
                outputs = self.pre.process(inputs, triton_io.request_parameters(request))
                responses.append(triton_io.make_response(outputs))
            except Exception as exc:  # never take the model down for one request
                responses.append(triton_io.exception_response(exc, "preprocessing"))
        return responses
