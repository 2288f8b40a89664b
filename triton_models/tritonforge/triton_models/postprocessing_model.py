"""Triton adapter of ``postprocess.Postprocessor`` (postprocessing/1/model.py imports it)."""

from __future__ import annotations

from typing import Any

from tritonforge.contract import POSTPROCESSING_INPUTS, Param
from tritonforge.triton_models import triton_io
from tritonforge.triton_models.detokenize import make_decoder
from tritonforge.triton_models.postprocess import Postprocessor
from tritonforge.triton_models.preprocess import load_tokenizer

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.fix_locale()
        _, params = triton_io.model_params(args)
        ref = params.get(Param.TOKENIZER.value) or params[Param.MODEL.value]
        skip = (params.get(Param.SKIP_SPECIAL_TOKENS.value) or "true").lower() != "false"
        tokenizer = load_tokenizer(ref)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.post = Postprocessor(
            make_decoder(tokenizer, skip_special_tokens=skip), None if eos is None else int(eos)
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                inputs = triton_io.read_inputs(request, POSTPROCESSING_INPUTS)
                result = self.post.process(inputs, request.request_id())
                responses.append(triton_io.make_response(result.arrays()))
            except Exception as exc:
                responses.append(triton_io.exception_response(exc, "postprocessing"))
        return responses
