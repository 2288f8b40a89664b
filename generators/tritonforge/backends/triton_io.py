"""Small helpers shared by the Python-backend adapters (import only inside tritonserver)."""

from __future__ import annotations

import json
import locale
from collections.abc import Iterable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonforge.contract import Tensor

__all__ = ["model_params", "read_inputs", "make_response", "error_response", "fix_locale"]


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
