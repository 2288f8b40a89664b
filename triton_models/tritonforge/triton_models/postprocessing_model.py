"""Triton adapter of ``postprocess.Postprocessor`` (postprocessing/1/model.py imports it).

It is also how a client that leaves an ensemble stream stops the engine. Triton's ensemble
scheduler does not tell a step that is already running (the engine) that the client has
gone; it marks the *next* step's request cancelled -- the postprocessing request made for the
engine's next response. So this model is configured without a dynamic batcher (which would
drop a cancelled request before ``execute`` sees it), and on a cancelled request it sends the
engine model the contract's ``stop`` for that engine request (``contract.engine_request_id``
of the key the engine returned; the client's request id where the engine sends no key, as
the TensorRT-LLM C++ backend does), drops the request's state and answers a final-looking
response (finish_reason "cancelled") -- not an error: in Triton 2.51 a step's error while
the engine step is still in flight leaves the ensemble request in flight for ever (see
``contract.ENGINE_EXTRA_OUTPUTS``). For the same reason the engine reports a failure after
streaming in-band (its ``error`` output), and this model, the last step, turns it into the
error response. Works
for every client: a gRPC stream cancelled or whose channel closed, an HTTP client that
disconnected (Triton's HTTP frontend cancels the request), the typed clients.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tritonforge.contract import POSTPROCESSING_INPUTS, FinishReason, Param, engine_request_id
from tritonforge.triton_models import triton_io
from tritonforge.triton_models.detokenize import make_decoder
from tritonforge.triton_models.metrics import PostprocessingMetrics
from tritonforge.triton_models.pacing import cancel_check_seconds
from tritonforge.triton_models.postprocess import Postprocessor, PostResult, scalar
from tritonforge.triton_models.preprocess import load_tokenizer
from tritonforge.triton_models.request_facts import FactsStore

# How often the request-facts gauge counts the store's entries (a folder listing).
FACTS_GAUGE_SECONDS = 1.0
# Cancelled streams remembered, so each is counted once (later requests of it are cancelled too).
CANCELLED_REMEMBERED = 4096

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        triton_io.prepare_stub(self, args)
        _, params = triton_io.model_params(args)
        ref = params.get(Param.TOKENIZER.value) or params[Param.MODEL.value]
        skip = (params.get(Param.SKIP_SPECIAL_TOKENS.value) or "true").lower() != "false"
        tokenizer = load_tokenizer(ref)
        eos = getattr(tokenizer, "eos_token_id", None)
        # Facts preprocessing leaves for the C++ engine's requests (read on the first
        # response, deleted on the last); harmless for tritonforge's engines, which send
        # their finish reason and request key.
        self.facts = FactsStore.for_model(args["model_repository"])
        self.post = Postprocessor(
            make_decoder(tokenizer, skip_special_tokens=skip), None if eos is None else int(eos),
            facts=self.facts.get, drop_facts=self.facts.drop,
        )
        self.metrics = PostprocessingMetrics(args["model_name"], args.get("model_version", "1"))
        self.post.finished = self.metrics.add_finished
        self._facts_counted = 0.0
        self._cancelled_ids: OrderedDict[str, None] = OrderedDict()
        self.engine = params.get(Param.ENGINE_MODEL.value) or ""
        # Stops go out on their own threads: execute never waits for the engine.
        self.stops = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tritonforge-stop")

    def _cancelled(self, request: Any, inputs: dict[str, Any]) -> Any:
        key = Postprocessor.request_key(inputs)
        target = engine_request_id(key) if key else request.request_id()
        self.post.forget(inputs, request.request_id())
        if self.engine and target:
            self.stops.submit(triton_io.send_stop, self.engine, target)
        # Triton marks every later postprocessing request of the stream cancelled: count the
        # stream once.
        sid = Postprocessor.state_id(inputs, request.request_id()) or target
        if sid not in self._cancelled_ids:
            self.metrics.add_finished(FinishReason.CANCELLED.value)
        self._cancelled_ids[sid] = None
        self._cancelled_ids.move_to_end(sid)
        while len(self._cancelled_ids) > CANCELLED_REMEMBERED:
            self._cancelled_ids.popitem(last=False)
        return triton_io.make_response(PostResult("", FinishReason.CANCELLED.value, -1, 0,
                                                  sequence_index=Postprocessor.sequence_index(inputs)).arrays())

    def _update_gauges(self) -> None:
        self.metrics.set_open_requests(self.post.open_requests)
        now = time.monotonic()
        if now - self._facts_counted >= FACTS_GAUGE_SECONDS or not self.post.open_requests:
            self._facts_counted = now
            self.metrics.set_request_facts(self.facts.count())

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                inputs = triton_io.read_inputs(request, POSTPROCESSING_INPUTS)
                rid = request.request_id()
                if (self.post.cancel_check_due(Postprocessor.state_id(inputs, rid),
                                                cancel_check_seconds(self.post.open_requests))
                        and request.is_cancelled()):
                    responses.append(self._cancelled(request, inputs))
                    continue
                error = str(scalar(inputs.get("engine_error"), "") or "")
                if error:  # the engine failed after streaming: answer its error, last
                    self.post.forget(inputs, rid)
                    responses.append(triton_io.tagged_error_response(error))
                    continue
                result = self.post.process(inputs, rid)
                responses.append(triton_io.make_response(result.arrays()))
            except Exception as exc:
                responses.append(triton_io.exception_response(exc, "postprocessing"))
        with contextlib.suppress(Exception):  # metrics never fail a response
            self._update_gauges()
        return responses

    def finalize(self) -> None:
        self.stops.shutdown(wait=True, cancel_futures=False)
        self.metrics.close()
