"""The non-decoupled ``<name>_sync`` model: one request in, one response out.

HTTP ``/generate``, gRPC ``ModelInfer`` and Triton's response cache all need a model that
answers each request with exactly one response; the streaming ensemble is decoupled. This
model forwards the request to the ensemble (Business Logic Scripting, with ``stream`` forced
to false) and returns its single answer, so the text is the same as the ensemble's.

Cancellation: the forwarded request carries an id of its own (unique), and a watchdog polls
each live request's ``is_cancelled()`` (a gRPC call cancelled) and, for a request that came
through ``tritonforge serve``'s HTTP front, whether the front marked the client gone (a file
named by the request's ``contract.FRONT_KEY_PARAMETER`` in ``$TRITONFORGE_CANCEL_DIR``: Triton
2.51's HTTP frontend never cancels a non-streamed request); for a cancelled one it sends the
engine model the contract's ``stop`` with that id, so the engine frees the request at once
instead of generating the whole answer for nobody (the 2.51 Python backend cannot cancel a
BLS call).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tritonforge.contract import (
    CANCEL_DIR_ENV,
    ENSEMBLE_INPUTS,
    ENSEMBLE_OUTPUTS,
    FRONT_KEY_PARAMETER,
    FRONT_KEY_PATTERN,
    Param,
    ParameterError,
    check_request_parameters,
)
from tritonforge.triton_models import triton_io
from tritonforge.triton_models.errors import RequestError

__all__ = ["TritonPythonModel", "merge_responses"]

_OUTPUT_NAMES = [t.name for t in ENSEMBLE_OUTPUTS]


def merge_responses(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Join the responses of one request: texts and token counts add up, the last reason wins."""
    text = b"".join(bytes(p["text_output"].reshape(-1)[0]) for p in parts if "text_output" in p)
    reason = b""
    for p in parts:
        if "finish_reason" in p and bytes(p["finish_reason"].reshape(-1)[0]):
            reason = bytes(p["finish_reason"].reshape(-1)[0])
    n_in = max((int(p["num_input_tokens"].reshape(-1)[0]) for p in parts if "num_input_tokens" in p), default=0)
    n_out = sum(int(p["num_output_tokens"].reshape(-1)[0]) for p in parts if "num_output_tokens" in p)
    lps = [float(v) for p in parts if "output_log_probs" in p for v in p["output_log_probs"].reshape(-1)]
    tops = [t for p in parts if "output_top_log_probs" in p and bytes(p["output_top_log_probs"].reshape(-1)[0])
            for t in json.loads(bytes(p["output_top_log_probs"].reshape(-1)[0]))]
    merged = {
        "text_output": np.array([[text]], dtype=object),
        "finish_reason": np.array([[reason]], dtype=object),
        "num_input_tokens": np.array([[n_in]], dtype=np.int32),
        "num_output_tokens": np.array([[n_out]], dtype=np.int32),
    }
    if lps:  # only when asked for: a response with an empty (0-byte) output is never cached
        merged["output_log_probs"] = np.array([lps], dtype=np.float32).reshape(1, len(lps))
        merged["output_top_log_probs"] = np.array(
            [[json.dumps(tops, ensure_ascii=False).encode() if tops else b""]], dtype=object)
    return merged


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.prepare_stub(self, args)
        _, params = triton_io.model_params(args)
        self.target = params[Param.TARGET_MODEL.value]
        self.engine = params.get(Param.ENGINE_MODEL.value) or ""
        self._live: dict[str, tuple[Any, str | None]] = {}  # forwarded id -> (request, front's mark)
        self._cancel_dir = os.environ.get(CANCEL_DIR_ENV) or None
        self._lock = threading.Lock()
        self._poll = triton_io.LivePoll(self._lock, self._live)
        self._stops = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tritonforge-stop")
        threading.Thread(target=self._watch, name="tritonforge-sync-cancel", daemon=True).start()

    def _watch(self) -> None:
        while self._poll.next_round():
            with self._lock:
                lives = list(self._live.items())
            for forwarded_id, (request, mark) in lives:
                # Asked under the lock, and only while execute still holds the request: once
                # execute has returned its response Triton releases the request, and
                # is_cancelled() on a released request reads freed memory (the stub crashed so).
                with self._lock:
                    if forwarded_id not in self._live:
                        continue
                    try:
                        cancelled = bool(request.is_cancelled()) or (mark is not None and os.path.exists(mark))
                    except Exception:
                        cancelled = True
                    if cancelled:
                        del self._live[forwarded_id]
                if cancelled:
                    if self.engine:
                        self._stops.submit(triton_io.send_stop, self.engine, forwarded_id)

    def _forward(self, request: Any) -> Any:
        # BLS requests carry no parameters on to the ensemble: check them here.
        parameters = triton_io.request_parameters(request)
        try:
            check_request_parameters(parameters)
        except ParameterError as exc:
            raise RequestError(str(exc), param=exc.param) from None
        key = parameters.get(FRONT_KEY_PARAMETER)
        mark = None
        if self._cancel_dir and isinstance(key, str) and FRONT_KEY_PATTERN.fullmatch(key):
            mark = os.path.join(self._cancel_dir, key)
        triton_io.refuse_many_sequences(request, "the non-streaming model")
        inputs = []
        batch = 1
        for t in ENSEMBLE_INPUTS:
            if t.name == "stream":
                continue
            tensor = pb_utils.get_input_tensor_by_name(request, t.name)
            if tensor is not None:
                inputs.append(tensor)
                batch = max(batch, int(tensor.as_numpy().shape[0]))
        # Same batch size as the request's inputs, so preprocessing (not Triton's batch check
        # on a tensor this model added) answers a wrong batch size, with its own message.
        inputs.append(pb_utils.Tensor("stream", np.zeros((batch, 1), dtype=bool)))
        forwarded_id = f"tritonforge-sync-{uuid.uuid4().hex}"
        bls = pb_utils.InferenceRequest(
            model_name=self.target, requested_output_names=_OUTPUT_NAMES, inputs=inputs,
            request_id=forwarded_id,
        )
        parts: list[dict[str, np.ndarray]] = []
        with self._lock:
            self._live[forwarded_id] = (request, mark)
            self._poll.registered()
        try:
            for response in bls.exec(decoupled=True):
                if response.has_error():
                    return triton_io.forwarded_error(response.error())
                tensors = {t.name(): t.as_numpy() for t in response.output_tensors()}
                if tensors:
                    parts.append(tensors)
        finally:
            with self._lock:
                self._live.pop(forwarded_id, None)
        return triton_io.make_response(merge_responses(parts))

    def finalize(self) -> None:
        self._poll.stop()
        self._stops.shutdown(wait=True)

    def execute(self, requests: list[Any]) -> list[Any]:
        out = []
        for request in requests:
            try:
                out.append(self._forward(request))
            except Exception as exc:
                out.append(triton_io.exception_response(exc, self.target))
        return out
