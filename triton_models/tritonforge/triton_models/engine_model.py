"""Triton adapter of the engine skeleton (the engine model's generated model.py imports it).

Decoupled: ``execute`` hands each request to the runner and returns at once; responses are
sent from the engine's loop thread through the request's response sender, the last one
flagged final. A request with ``stop=true`` cancels the live request(s) carrying the same
request id, as with the TensorRT-LLM backend. Non-decoupled (streaming off in the spec):
``execute`` waits for each request's single response.

Which engine adapter runs is the ``tritonforge_engine_kind`` parameter (vLLM by default):
``trtllm_llmapi`` runs TensorRT-LLM's LLM API (``engine.trtllm_llmapi``; its ``LLM()``
arguments in ``1/model.yaml``); ``trtllm_cpp`` runs vLLM answering as NVIDIA's C++ backend
does (see ``EngineRunner.cpp_outputs``) -- the CPU stand-in for that backend in tests. It
is not TensorRT-LLM: it reads and answers the C++ backend's own tensor names, the ones
``tritonforge.render.trtllm_params`` records from upstream's template (NVIDIA/TensorRT-LLM
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``), and follows
the backend's C++ (``triton_backend/inflight_batcher_llm/src/``): ``utils.cc`` for what a
request's tensors mean (``num_return_sequences``, ``return_log_probs``,
``guided_decoding_guide_type`` in json / json_schema / regex / ebnf_grammar,
``guided_decoding_guide``), ``model_instance_state.cc`` for what it answers
(``output_ids``/``sequence_length`` per response, ``output_log_probs`` [1, beams, tokens]
only when asked for, ``sequence_index`` only when num_return_sequences > 1, the final flag
once every sequence has ended). The tokens are real vLLM's, on this CPU.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tritonforge.contract import (
    ENGINE_INPUTS,
    EngineKind,
    ErrorKind,
    FinishReason,
    Param,
    is_stop_request,
)
from tritonforge.triton_models import triton_io
from tritonforge.triton_models.engine import EngineRunner, engine_outputs, parse_engine_inputs
from tritonforge.triton_models.errors import RequestError

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

    def send_error(self, kind: ErrorKind, message: str, param: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.sender.send(triton_io.error_response(kind, message, param), flags=_FINAL)

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

    def send_error(self, kind: ErrorKind, message: str, param: str | None = None) -> None:
        self.response = triton_io.error_response(kind, message, param)
        self.event.set()

    def is_cancelled(self) -> bool:
        return bool(self.request.is_cancelled())


def _llm_args(args: dict[str, Any]) -> dict[str, Any]:
    """The LLM-API engine model's ``tensorrt_llm.LLM()`` arguments: ``1/model.yaml``."""
    import yaml

    path = Path(args["model_repository"]) / str(args.get("model_version") or "1") / "model.yaml"
    data = yaml.safe_load(path.read_text("utf-8"))
    if not isinstance(data, dict) or "model" not in data:
        raise ValueError(f"{path}: must be a mapping of tensorrt_llm.LLM() arguments with 'model'")
    return data


def _make_adapter(kind: EngineKind, params: dict[str, str], args: dict[str, Any]) -> Any:
    lora = json.loads(params.get(Param.LORA_ADAPTERS.value) or "{}")
    if kind is EngineKind.TRTLLM_LLMAPI:
        from tritonforge.triton_models.engine.trtllm_llmapi import LlmApiAdapter

        return LlmApiAdapter(_llm_args(args), lora_adapters=lora)
    if kind in (EngineKind.VLLM, EngineKind.TRTLLM_CPP):  # TRTLLM_CPP: the CPU stand-in
        from tritonforge.runtime.models import resolve_model
        from tritonforge.triton_models.engine.vllm import VllmAdapter

        engine_args = json.loads(params.get(Param.ENGINE_ARGS.value) or "{}")
        engine_args.pop("model", None)
        return VllmAdapter(str(resolve_model(params[Param.MODEL.value])), engine_args,
                           lora_adapters=lora)
    raise ValueError(f"{Param.ENGINE_KIND.value}: no engine adapter for {kind.value!r} in this model")


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.prepare_stub(self, args)
        config, params = triton_io.model_params(args)
        for key, value in json.loads(params.get(Param.ENGINE_ENV.value) or "{}").items():
            os.environ[str(key)] = str(value)
        if "VLLM_CPU_KVCACHE_SPACE" in os.environ:  # vLLM on a CPU: its allocator (runtime.preload)
            from tritonforge.runtime.preload import with_tcmalloc

            os.environ["LD_PRELOAD"] = with_tcmalloc(os.environ.get("LD_PRELOAD", ""))
        kind = EngineKind(params.get(Param.ENGINE_KIND.value) or EngineKind.VLLM.value)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        try:
            from tritonforge.triton_models.metrics import EngineMetrics

            metrics: Any = EngineMetrics(args["model_name"], args.get("model_version", "1"))
        except ImportError:
            metrics = None
        queue = int(params.get(Param.MAX_QUEUE_SIZE.value) or 0)
        self.runner = EngineRunner(_make_adapter(kind, params, args), metrics=metrics,
                                   max_queue_size=queue or None,
                                   cpp_outputs=kind is EngineKind.TRTLLM_CPP,
                                   # the C++ backend's stand-in streams every token, as the backend does
                                   stream_interval_s=0.0 if kind is EngineKind.TRTLLM_CPP
                                   else int(params.get(Param.STREAM_INTERVAL_MS.value) or 0) / 1000,
                                   coalesce_from=int(params.get(Param.COALESCE_FROM.value) or 1))
        self.runner.start()

    def _handle(self, request: Any, responder: Any) -> None:
        inputs = triton_io.read_inputs(request, ENGINE_INPUTS)
        if is_stop_request(inputs):
            self._answer_stop(request, responder)
            return
        try:
            req = parse_engine_inputs(inputs, decoupled=self.decoupled)
        except RequestError as exc:
            responder.send_error(exc.kind, str(exc), exc.param)
            return
        self.runner.submit(req, responder, request.request_id())

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.decoupled:
            for request in requests:
                self._handle(request, _DecoupledResponder(request))
            return None
        collectors = [_CollectingResponder(r) for r in requests]
        for request, c in zip(requests, collectors):
            self._handle(request, c)
        for c in collectors:
            c.event.wait()
        return [c.response for c in collectors]

    def _answer_stop(self, request: Any, responder: Any) -> None:
        """``stop=true``: cancel the live request(s) with this request id, answer at once."""
        request_id = request.request_id()
        if not request_id:
            responder.send_error(ErrorKind.INVALID_REQUEST,
                                 "stop needs the request id of the request to cancel", "stop")
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
