"""Small helpers shared by the Python-backend adapters (import only inside tritonserver)."""

from __future__ import annotations

import json
import locale
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonforge.contract import Tensor

__all__ = [
    "error_response",
    "fix_locale",
    "forwarded_error",
    "make_response",
    "model_params",
    "read_inputs",
]


def fix_locale() -> None:
    """The stub's embedded Python starts with an ASCII locale; torch/vLLM need UTF-8."""
    for name in ("C.UTF-8", "en_US.UTF-8"):
        try:
            locale.setlocale(locale.LC_ALL, name)
            return
        except locale.Error:
            continue


def model_params(args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    config = json.loads(args["model_config"])
    params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
    return config, params


def read_inputs(request: Any, tensors: Iterable[Tensor]) -> dict[str, np.ndarray | None]:
    out: dict[str, np.ndarray | None] = {}
    for t in tensors:
        tensor = pb_utils.get_input_tensor_by_name(request, t.name)
        out[t.name] = None if tensor is None else tensor.as_numpy()
    return out


def make_response(arrays: dict[str, np.ndarray]) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])


def error_response(message: str, *, invalid: bool = True, cancelled: bool = False) -> Any:
    if cancelled:
        code = pb_utils.TritonError.CANCELLED
    elif invalid:
        code = pb_utils.TritonError.INVALID_ARG
    else:
        code = pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


# How tritonforge's models word an internal failure ("<step> failed: <reason>"); any other
# message from a step is a refused request. The clients read in-stream errors the same way.
_INTERNAL_MESSAGE = re.compile(r"\bfailed: |internal error|engine error", re.IGNORECASE)


def forwarded_error(error: Any) -> Any:
    """The response for an error a BLS call returned, keeping it a client error.

    The Python backend hands BLS errors back as INTERNAL whatever their code was, so a
    request the ensemble refused (INVALID_ARG) would reach a ``ModelInfer`` client as an
    internal error (gRPC INTERNAL / HTTP 500). The code is kept when it survived; otherwise
    it is recovered from the message's wording.
    """
    message = str(error.message()) if hasattr(error, "message") else str(error)
    code = error.code() if hasattr(error, "code") else pb_utils.TritonError.INTERNAL
    if code == pb_utils.TritonError.INTERNAL and not _INTERNAL_MESSAGE.search(message):
        cancelled = "request cancelled" in message
        code = pb_utils.TritonError.CANCELLED if cancelled else pb_utils.TritonError.INVALID_ARG
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
