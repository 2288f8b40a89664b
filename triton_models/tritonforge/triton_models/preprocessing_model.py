"""Triton adapter of ``preprocess.Preprocessor`` (the generated preprocessing/1/model.py imports it)."""

from __future__ import annotations

from typing import Any

from tritonforge.triton_models import triton_io
from tritonforge.triton_models.errors import RequestError
from tritonforge.triton_models.preprocess import Preprocessor
from tritonforge.contract import PREPROCESSING_INPUTS

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.fix_locale()
        _, params = triton_io.model_params(args)
        self.pre = Preprocessor.from_params(params)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                inputs = triton_io.read_inputs(request, PREPROCESSING_INPUTS)
                responses.append(triton_io.make_response(self.pre.process(inputs)))
            except RequestError as exc:
                responses.append(triton_io.error_response(str(exc)))
            except Exception as exc:  # never take the model down for one request
                responses.append(triton_io.error_response(f"preprocessing failed: {exc}", invalid=False))
        return responses
