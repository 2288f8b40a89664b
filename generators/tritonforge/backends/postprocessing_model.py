"""Triton adapter of ``postprocess.Postprocessor`` (postprocessing/1/model.py imports it)."""

from __future__ import annotations

from typing import Any

from tritonforge.backends import triton_io
from tritonforge.backends.detokenize import make_decoder
from tritonforge.backends.postprocess import Postprocessor
from tritonforge.backends.preprocess import load_tokenizer
from tritonforge.contract import POSTPROCESSING_INPUTS, Param

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.fix_locale()
        _, params = triton_io.model_params(args)
        ref = params.get(Param.TOKENIZER.value) or params[Param.MODEL.value]
        skip = (params.get(Param.SKIP_SPECIAL_TOKENS.value) or "true").lower() != "false"
        self.post = Postprocessor(make_decoder(load_tokenizer(ref), skip_special_tokens=skip))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                inputs = triton_io.read_inputs(request, POSTPROCESSING_INPUTS)
                responses.append(triton_io.make_response(self.post.process(inputs).arrays()))
            except Exception as exc:
                responses.append(triton_io.error_response(f"postprocessing failed: {exc}", invalid=False))
        return responses
