"""Small helpers shared by the Python-backend adapters (import only inside tritonserver)."""

from __future__ import annotations

import json
import locale
import logging
import threading
from collections.abc import Iterable, Sized
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tritonforge.contract import STOP_REQUEST, ErrorKind, Tensor, format_error, parse_error
from tritonforge.triton_models.errors import ModelError

__all__ = [
    "CANCEL_POLL_SECONDS",
    "LivePoll",
    "error_response",
    "exception_response",
    "fix_locale",
    "forwarded_error",
    "make_response",
    "model_params",
    "prepare_stub",
    "read_inputs",
    "request_parameters",
    "send_stop",
    "stop_request",
    "tagged_error_response",
    "triton_error",
]

# How often the ``_sync`` and BLS models ask Triton whether a live request was cancelled
# (each ask is an IPC round trip to tritonserver); they do not poll while none is live.
CANCEL_POLL_SECONDS = 0.05


class LivePoll:
    """The pacing of a cancellation watchdog over a dict of live requests guarded by ``lock``:
    :meth:`next_round` sleeps while none is live (an idle stub does not wake), then
    ``CANCEL_POLL_SECONDS``; :meth:`registered` (called under ``lock``) wakes it."""

    def __init__(self, lock: threading.Lock, live: Sized) -> None:
        self._any_live = threading.Condition(lock)
        self._live = live
        self._stopping = threading.Event()

    def registered(self) -> None:
        self._any_live.notify()

    def next_round(self) -> bool:
        """False once :meth:`stop` was called."""
        with self._any_live:
            self._any_live.wait_for(lambda: bool(self._live) or self._stopping.is_set())
        return not self._stopping.wait(CANCEL_POLL_SECONDS)

    def stop(self) -> None:
        self._stopping.set()
        with self._any_live:
            self._any_live.notify()


def prepare_stub(model: Any, args: dict[str, Any]) -> None:
    """What every tritonforge model does first in ``initialize()``: a UTF-8 locale
    (``fix_locale``), and a quick exit of the stub process once Triton has finalized it.

    After ``finalize()`` the stub's embedded interpreter tears down torch, tokenizers and
    vLLM's leftovers: seconds per stub on a small machine (all stubs at once at shutdown),
    and vLLM's pending objects crashed it there ("Segfault encountered"). Nothing needs that
    teardown -- the models released their resources in ``finalize()`` and Triton cleans the
    shared memory -- so an exit handler flushes the output and ends the process at once.

    It also honours ``$PYTHONPATH``, which the stub's embedded interpreter does not read
    (seen on 2.51: a package there was not importable): its entries go first on
    ``sys.path``, as a plain interpreter would put them; it puts the stub's health thread,
    which the backend gives a 1-s deadline, in the real-time class
    (``stub_health.favour_health_thread``); and it watches for stalls that may still have
    missed that deadline (``stub_health.StallWatch``: ``model.execute`` is wrapped to be
    counted).
    """
    fix_locale()
    import os

    from tritonforge.contract import RESTART_FILE_ENV
    from tritonforge.triton_models.stub_health import StallWatch, favour_health_thread

    why_not = favour_health_thread()
    if why_not:
        logging.getLogger("tritonforge.stub").warning("%s", why_not)
    name = str(args.get("model_instance_name") or args.get("model_name") or "?")
    watch = StallWatch(name, os.environ.get(RESTART_FILE_ENV) or None).start()
    model.execute = watch.track(model.execute)
    import atexit
    import contextlib
    import sys

    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra

    def _exit_now() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # exiting anyway
                stream.flush()
        os._exit(0)

    atexit.register(_exit_now)


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
    """The request's ``tensors`` by name (``None`` where absent), in one pass over its inputs
    (``pb_utils.get_input_tensor_by_name`` walks them all for each name, and postprocessing
    reads nine names per streamed token)."""
    given = {t.name(): t for t in request.inputs()}
    out: dict[str, np.ndarray | None] = {}
    for t in tensors:
        tensor = given.get(t.name)
        out[t.name] = None if tensor is None else tensor.as_numpy()
    return out


def make_response(arrays: dict[str, np.ndarray]) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])


def triton_error(kind: ErrorKind, message: str, param: str | None = None) -> Any:
    """A ``TritonError`` of ``kind``'s code whose message carries the machine-readable tag."""
    return pb_utils.TritonError(format_error(kind, message, param), getattr(pb_utils.TritonError, kind.triton_code))


def error_response(kind: ErrorKind, message: str, param: str | None = None) -> Any:
    """The response for a failed request (see ``contract.format_error``)."""
    return pb_utils.InferenceResponse(error=triton_error(kind, message, param))


def exception_response(exc: BaseException, step: str) -> Any:
    """The response for an exception a model's logic raised: a ``ModelError`` keeps its
    kind and parameter; anything else is an internal failure of ``step``."""
    if isinstance(exc, ModelError):
        return error_response(exc.kind, str(exc), exc.param)
    return error_response(ErrorKind.INTERNAL, f"{step} failed: {exc}")


def refuse_many_sequences(request: Any, model: str) -> None:
    """A model that answers one sequence per request (the BLS and ``_sync`` models) refuses
    ``num_return_sequences`` > 1, naming it, rather than mix the sequences up."""
    from tritonforge.triton_models.errors import RequestError

    tensor = pb_utils.get_input_tensor_by_name(request, "num_return_sequences")
    n = tensor.as_numpy().reshape(-1) if tensor is not None else np.zeros(0, dtype=np.int32)
    if n.size and int(n[0]) > 1:
        raise RequestError(f"num_return_sequences must be 1 on {model}, which answers one sequence; "
                           "send it to the streaming ensemble", param="num_return_sequences")


def request_parameters(request: Any) -> dict[str, Any]:
    """The request's parameters (Triton's own and any unknown JSON keys of ``generate``)."""
    raw = request.parameters()
    try:
        value = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def forwarded_error(error: Any) -> Any:
    """The response for an error a BLS call returned, keeping its kind.

    The Python backend hands BLS errors back as INTERNAL whatever their code was; the kind
    travels in the message's tag (``contract.parse_error``), so the code is restored from
    it. An untagged error (Triton's own) is passed on as it came.
    """
    message = str(error.message()) if hasattr(error, "message") else str(error)
    info = parse_error(message)
    if info is None:
        code = error.code() if hasattr(error, "code") else pb_utils.TritonError.INTERNAL
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, info.kind.triton_code)))


def stop_request(model: str, request_id: str) -> Any:
    """The BLS request that cancels ``request_id`` on the engine model ``model``
    (``contract.STOP_REQUEST``)."""
    inputs = [pb_utils.Tensor(name, np.full((1, 1), value, dtype=dtype.numpy))
              for name, dtype, value in STOP_REQUEST]
    return pb_utils.InferenceRequest(model_name=model, request_id=request_id, inputs=inputs,
                                     requested_output_names=["output_ids"])


def send_stop(model: str, request_id: str) -> bool:
    """Send ``stop_request`` and wait for the engine's answer; False (logged) on failure."""
    try:
        for response in stop_request(model, request_id).exec(decoupled=True):
            if response.has_error():
                logging.getLogger("tritonforge.stop").warning(
                    "stop of %s on %s failed: %s", request_id, model, response.error().message())
                return False
        return True
    except Exception:
        logging.getLogger("tritonforge.stop").exception("stop of %s on %s failed", request_id, model)
        return False


def tagged_error_response(message: str) -> Any:
    """The error response for a message ``contract.format_error`` wrote (an engine's
    in-band ``error``), with its kind's code; untagged text is an engine failure."""
    info = parse_error(message)
    if info is None:
        return error_response(ErrorKind.ENGINE_FAILURE, message)
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, info.kind.triton_code)))
