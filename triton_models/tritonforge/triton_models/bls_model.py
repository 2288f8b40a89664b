"""The BLS front model (``tensorrt_llm_bls``): the ensemble's chain, in code, cancellable.

Same user contract as the ensemble (``ENSEMBLE_INPUTS`` -> ``ENSEMBLE_OUTPUTS``). It calls
``preprocessing``, then streams from the engine model with Business Logic Scripting, and
detokenizes in process (the same ``Postprocessor`` the ensemble's postprocessing runs).

Why it exists: Triton 2.51 ensembles do not pass a client's cancellation on to a step that is
already running, so a client that simply drops its connection leaves the engine generating
until ``max_tokens``. This model sees its own request's ``is_cancelled()`` (a direct request)
and then sends the engine contract's ``stop`` for the request id, which frees the engine's
slot and KV cache at once. Each request is served on its own thread (BLS calls block), so
requests never wait for each other here.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tritonforge.contract import (
    ENGINE_EXTRA_OUTPUTS,
    ENSEMBLE_INPUTS,
    MODEL_PREPROCESSING,
    PREPROCESSING_OUTPUTS,
    EngineKind,
    ErrorKind,
    FinishReason,
    Param,
    ParameterError,
    check_request_parameters,
    engine_inputs_for,
    engine_request_id,
    pre_output,
)
from tritonforge.triton_models import triton_io
from tritonforge.triton_models.detokenize import make_decoder
from tritonforge.triton_models.errors import RequestError
from tritonforge.triton_models.postprocess import Postprocessor, scalar
from tritonforge.triton_models.preprocess import load_tokenizer

__all__ = ["TritonPythonModel"]

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_PRE_OUTPUTS = [t.name for t in PREPROCESSING_OUTPUTS]


class _Live:
    __slots__ = ("cancelled", "key", "request", "request_id")

    def __init__(self, request: Any, request_id: str) -> None:
        self.request = request
        self.request_id = request_id
        self.key = 0  # the engine's own key, from its first response
        self.cancelled = threading.Event()

    def stop_id(self) -> str:
        """Whom a stop names: exactly this engine request once its key is known."""
        return engine_request_id(self.key) if self.key else self.request_id


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.prepare_stub(self, args)
        config, params = triton_io.model_params(args)
        self.engine = params[Param.TARGET_MODEL.value]
        kind = EngineKind(params.get(Param.ENGINE_KIND.value) or EngineKind.VLLM.value)
        self.engine_inputs = engine_inputs_for(kind, ("lora",))  # lora_task_id only when set
        ref = params.get(Param.TOKENIZER.value) or params.get(Param.MODEL.value)
        if not ref:
            raise ValueError(f"{args['model_name']}: parameter {Param.MODEL.value} is required")
        skip = (params.get(Param.SKIP_SPECIAL_TOKENS.value) or "true").lower() != "false"
        tokenizer = load_tokenizer(ref)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.post = Postprocessor(make_decoder(tokenizer, skip), None if eos is None else int(eos))
        self._post_lock = threading.Lock()
        self.engine_outputs = ["output_ids", "sequence_length", "output_log_probs"]
        if kind is not EngineKind.TRTLLM_CPP:  # tritonforge's engine model adds these
            self.engine_outputs += [t.name for t in ENGINE_EXTRA_OUTPUTS] + ["sequence_index"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="tritonforge-bls")
        self._live: dict[int, _Live] = {}
        self._live_lock = threading.Lock()
        self._poll = triton_io.LivePoll(self._live_lock, self._live)
        self._watchdog = threading.Thread(target=self._watch, name="tritonforge-bls-cancel", daemon=True)
        self._watchdog.start()

    # -- cancellation --------------------------------------------------------------------
    def _watch(self) -> None:
        while self._poll.next_round():
            with self._live_lock:
                lives = list(self._live.items())
            for key, live in lives:
                # Asked under the lock, and only while the request is still registered: once
                # its final response is out Triton releases the request, and is_cancelled() on
                # a released request reads freed memory (the stub crashed so).
                with self._live_lock:
                    if self._live.get(key) is not live or live.cancelled.is_set():
                        continue
                    try:
                        cancelled = bool(live.request.is_cancelled())
                    except Exception:
                        cancelled = True
                if cancelled:
                    live.cancelled.set()
                    self.pool.submit(triton_io.send_stop, self.engine, live.stop_id())

    # -- requests ------------------------------------------------------------------------
    def execute(self, requests: list[Any]) -> list[Any] | None:
        if not self.decoupled:
            return [self._collect(r) for r in requests]
        for request in requests:
            self.pool.submit(self._serve, request)
        return None

    def _collect(self, request: Any) -> Any:
        parts: list[dict[str, np.ndarray]] = []
        error: list[Any] = []

        def send(arrays: dict[str, np.ndarray] | None, err: Any = None) -> None:
            if err is not None:
                error.append(err)
            elif arrays is not None:
                parts.append(arrays)

        try:
            self._run(request, send, streaming=False)
        except Exception as exc:
            return triton_io.exception_response(exc, f"{self.engine} BLS")
        if error:
            return error[0]
        from tritonforge.triton_models.sync_model import merge_responses

        return triton_io.make_response(merge_responses(parts))

    def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        pending: list[Any] = []

        def send(arrays: dict[str, np.ndarray] | None, err: Any = None) -> None:
            # Keep one response back so the last one carries the FINAL flag.
            if pending:
                sender.send(pending.pop(), flags=0)
            if err is not None:
                sender.send(err, flags=_FINAL)
            elif arrays is not None:
                pending.append(triton_io.make_response(arrays))

        try:
            self._run(request, send, streaming=True)
        except Exception as exc:
            send(None, triton_io.exception_response(exc, f"{self.engine} BLS"))
            return
        if pending:
            sender.send(pending.pop(), flags=_FINAL)

    def _run(self, request: Any, send: Any, *, streaming: bool) -> None:
        request_id = request.request_id() or uuid.uuid4().hex
        # BLS requests carry no parameters on to preprocessing: check them here.
        try:
            check_request_parameters(triton_io.request_parameters(request))
        except ParameterError as exc:
            raise RequestError(str(exc), param=exc.param) from None
        triton_io.refuse_many_sequences(request, "the BLS model")
        inputs = [t for t in (pb_utils.get_input_tensor_by_name(request, i.name) for i in ENSEMBLE_INPUTS)
                  if t is not None]
        if not streaming:
            inputs = [t for t in inputs if t.name() != "stream"]
            inputs.append(pb_utils.Tensor("stream", np.array([[False]], dtype=bool)))
        pre = pb_utils.InferenceRequest(
            model_name=MODEL_PREPROCESSING, request_id=request_id, inputs=inputs,
            requested_output_names=_PRE_OUTPUTS,
        ).exec()
        if pre.has_error():
            send(None, triton_io.forwarded_error(pre.error()))
            return
        produced = {t.name(): t for t in pre.output_tensors()}
        engine_inputs = []
        for name in self.engine_inputs:
            tensor = produced.get(pre_output(name))
            if tensor is None:
                continue
            arr = tensor.as_numpy()
            if name == "lora_task_id" and not arr.any():
                continue  # no adapter: the engine must not see a LoRA request
            engine_inputs.append(pb_utils.Tensor(name, arr))
        live = _Live(request, request_id)
        key = id(live)
        with self._live_lock:
            self._live[key] = live
            self._poll.registered()
        sent_final = False
        final_error: Any = None  # sent once the request is out of the watchdog's reach

        def unregister() -> None:
            with self._live_lock:
                self._live.pop(key, None)

        try:
            responses = pb_utils.InferenceRequest(
                model_name=self.engine, request_id=request_id, inputs=engine_inputs,
                requested_output_names=self.engine_outputs,
            ).exec(decoupled=True)
            for response in responses:
                if response.has_error():
                    if live.cancelled.is_set():
                        break
                    final_error = triton_io.forwarded_error(response.error())
                    sent_final = True
                    break
                tensors = {t.name(): t.as_numpy() for t in response.output_tensors()}
                if "output_ids" not in tensors:
                    continue  # an empty final response
                if not live.key and "request_key" in tensors:
                    live.key = int(tensors["request_key"].reshape(-1)[0])
                error = str(scalar(tensors.get("error"), "") or "")
                if error:  # failed after streaming (the engine reports it in-band)
                    final_error = triton_io.tagged_error_response(error)
                    sent_final = True
                    break
                post_in = {
                    "output_ids": tensors["output_ids"],
                    "sequence_length": tensors.get("sequence_length"),
                    "engine_finish_reason": tensors.get("finish_reason"),
                    "engine_num_input_tokens": tensors.get("num_input_tokens"),
                    "engine_request_key": tensors.get("request_key"),
                    "engine_output_log_probs": tensors.get("output_log_probs"),
                    "engine_top_log_probs": tensors.get("top_log_probs"),
                }
                with self._post_lock:
                    result = self.post.process(post_in, request_id)
                send(result.arrays())
                if result.finish_reason:
                    sent_final = True
            unregister()
            if final_error is not None:
                send(None, final_error)
            elif live.cancelled.is_set() and not sent_final:
                send(None, triton_io.error_response(ErrorKind.CANCELLED, "request cancelled"))
            elif not sent_final:
                with self._post_lock:
                    result = self.post.process({
                        "output_ids": np.zeros((1, 1, 0), dtype=np.int32),
                        "sequence_length": np.zeros((1, 1), dtype=np.int32),
                        "engine_finish_reason": np.array([[FinishReason.STOP.value.encode()]], dtype=object),
                        "engine_request_key": np.array([[live.key]], dtype=np.uint64),
                    }, request_id)
                send(result.arrays())
        finally:
            unregister()
            if live.cancelled.is_set():
                with self._post_lock:
                    self.post.forget({"engine_request_key": np.array([[live.key]], dtype=np.uint64)},
                                     request_id)

    def finalize(self) -> None:
        self._poll.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
