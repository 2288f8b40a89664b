"""Triton adapter of the vLLM engine runner (vllm_engine/1/model.py imports it).

Decoupled: ``execute`` hands each request to the runner and returns at once; responses are
sent from the engine's loop thread through the request's response sender, the last one
flagged final. A request with ``stop=true`` cancels the live request(s) carrying the same
request id, as with the TensorRT-LLM backend: Triton 2.51 ensembles do not pass a client's
cancellation on to a step that is already running, so this is how a client (or the BLS
front model) stops generation it no longer wants. Non-decoupled (streaming off in the spec): ``execute`` waits for each
request's single response.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonforge.triton_models import triton_io
from tritonforge.triton_models.engine import VllmEngineRunner, engine_outputs, parse_engine_inputs
from tritonforge.triton_models.errors import RequestError
from tritonforge.contract import ENGINE_INPUTS, FinishReason, Param

__all__ = ["TritonPythonModel"]

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _DecoupledResponder:
    __slots__ = ("done", "request", "sender")

    def __init__(self, request: Any) -> None:
        self.request = request
        self.sender = request.get_response_sender()
        self.done = False

    def send(self, outputs: dict[str, np.ndarray], final: bool) -> None:
        if self.done:
            return
        self.done = final
        self.sender.send(triton_io.make_response(outputs), flags=_FINAL if final else 0)

    def send_error(self, message: str, *, invalid: bool, cancelled: bool = False) -> None:
        if self.done:
            return
        self.done = True
        self.sender.send(
            triton_io.error_response(message, invalid=invalid, cancelled=cancelled), flags=_FINAL
        )

    def is_cancelled(self) -> bool:
        return bool(self.request.is_cancelled())


class _CollectingResponder:
    """Non-decoupled mode: keep the one final response for ``execute`` to return."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.response: Any = None
        self.event = threading.Event()

    def send(self, outputs: dict[str, np.ndarray], final: bool) -> None:
        if final:
            self.response = triton_io.make_response(outputs)
            self.event.set()

    def send_error(self, message: str, *, invalid: bool, cancelled: bool = False) -> None:
        self.response = triton_io.error_response(message, invalid=invalid, cancelled=cancelled)
        self.event.set()

    def is_cancelled(self) -> bool:
        return bool(self.request.is_cancelled())


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.fix_locale()
        config, params = triton_io.model_params(args)
        for key, value in json.loads(params.get(Param.ENGINE_ENV.value) or "{}").items():
            os.environ[str(key)] = str(value)
        from tritonforge.runtime.models import resolve_model

        model_path = resolve_model(params[Param.MODEL.value])
        engine_args = json.loads(params.get(Param.ENGINE_ARGS.value) or "{}")
        engine_args.pop("model", None)
        lora = json.loads(params.get(Param.LORA_ADAPTERS.value) or "{}")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        try:
            from tritonforge.triton_models.metrics import EngineMetrics

            metrics: Any = EngineMetrics(args["model_name"], args.get("model_version", "1"))
        except ImportError:
            metrics = None
        self.runner = VllmEngineRunner(str(model_path), engine_args, lora_adapters=lora, metrics=metrics)
        self.runner.start()

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.decoupled:
            for request in requests:
                responder = _DecoupledResponder(request)
                if self._is_stop(request):
                    self._answer_stop(request, responder)
                    continue
                try:
                    req = parse_engine_inputs(triton_io.read_inputs(request, ENGINE_INPUTS), decoupled=True)
                except RequestError as exc:
                    responder.send_error(str(exc), invalid=True)
                    continue
                self.runner.submit(req, responder, request.request_id())
            return None
        collectors = []
        for request in requests:
            c = _CollectingResponder(request)
            if self._is_stop(request):
                self._answer_stop(request, c)
                collectors.append(c)
                continue
            try:
                req = parse_engine_inputs(triton_io.read_inputs(request, ENGINE_INPUTS), decoupled=False)
                self.runner.submit(req, c, request.request_id())
            except RequestError as exc:
                c.send_error(str(exc), invalid=True)
            collectors.append(c)
        for c in collectors:
            c.event.wait()
        return [c.response for c in collectors]

    @staticmethod
    def _is_stop(request: Any) -> bool:
        tensor = pb_utils.get_input_tensor_by_name(request, "stop")
        return tensor is not None and bool(tensor.as_numpy().reshape(-1)[:1].any())

    def _answer_stop(self, request: Any, responder: Any) -> None:
        """``stop=true``: cancel the live request(s) with this request id, answer at once."""
        request_id = request.request_id()
        if not request_id:
            responder.send_error("stop needs the request id of the request to cancel", invalid=True)
            return
        found = self.runner.stop(request_id).result(10)
        responder.send(engine_outputs([], FinishReason.CANCELLED.value if found else "", 0), final=True)

    def finalize(self) -> None:
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.shutdown()
            close = getattr(runner.metrics, "close", None)
            if close is not None:
                close()  # flush, then release metrics before their families (Triton's rule)
