"""The gateway's Prometheus metrics (``GET /metrics``), all named ``tritonforge_gateway_*``.

Each app owns its registry, so several gateways (tests, threads) can live in one process.

* ``tritonforge_gateway_requests_total{endpoint, status}``: finished requests by outcome in
  HTTP terms: the status sent, or, for a stream that failed after its 200 header, the status
  the failure maps to; ``499`` when the client went away first.
* ``tritonforge_gateway_requests_in_flight{endpoint}``: requests being answered.
* ``tritonforge_gateway_time_to_first_token_seconds{endpoint}``: request received to the
  first generated text ready to send (histogram).
* ``tritonforge_gateway_request_duration_seconds{endpoint}``: request received to the last
  byte (histogram).
* ``tritonforge_gateway_prompt_tokens_total{endpoint}`` and
  ``tritonforge_gateway_completion_tokens_total{endpoint}``: tokens of finished generations.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CLIENT_CLOSED", "CONTENT_TYPE", "PREFIX", "GatewayMetrics"]

PREFIX: Final = "tritonforge_gateway"
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
CLIENT_CLOSED: Final = 499  # the client disconnected before the answer ended (nginx's code)

# Seconds; CPU generation is slow, GPU fast: cover 10 ms .. 2 min.
_TTFT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_DURATION_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    """The metric families of one gateway app, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Finished requests by endpoint and HTTP status.",
                                ["endpoint", "status"], registry=r)
        self.in_flight = Gauge(f"{PREFIX}_requests_in_flight", "Requests being answered.",
                               ["endpoint"], registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "Request received to first generated text, seconds.",
                              ["endpoint"], buckets=_TTFT_BUCKETS, registry=r)
        self.duration = Histogram(f"{PREFIX}_request_duration_seconds",
                                  "Request received to last byte, seconds.",
                                  ["endpoint"], buckets=_DURATION_BUCKETS, registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of finished generations.",
                                     ["endpoint"], registry=r)
        self.completion_tokens = Counter(f"{PREFIX}_completion_tokens",
                                         "Generated tokens of finished generations.",
                                         ["endpoint"], registry=r)

    def finished(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.duration.labels(endpoint).observe(seconds)

    def tokens(self, endpoint: str, prompt: int, completion: int) -> None:
        self.prompt_tokens.labels(endpoint).inc(max(prompt, 0))
        self.completion_tokens.labels(endpoint).inc(completion)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
