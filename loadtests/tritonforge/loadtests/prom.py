"""Prometheus exporter for a running load test (served from the Locust master).

While a load test runs, its client-side view -- time to first token, inter-token latency,
output tokens and request outcomes -- is exposed on an HTTP ``/metrics`` endpoint so that
Prometheus scrapes it next to Triton's own metrics and one dashboard shows both sides.

Interface (small on purpose)::

    exporter = start_exporter(9646, model="ensemble")   # port 0 picks a free port
    exporter.observe_ttft(0.21)            # seconds from request sent to first token
    exporter.observe_itl(0.034)            # seconds between two tokens (one per gap)
    exporter.add_output_tokens(57)         # tokens received
    exporter.add_request(success=True)     # one finished request, by outcome
    exporter.set_users(8)                  # current simulated users (optional)
    exporter.url                           # "http://127.0.0.1:PORT/metrics"
    exporter.close()                       # stop serving (also a context manager)

Metric names (all labelled ``model``):

* ``tritonforge_loadtest_time_to_first_token_seconds`` -- histogram
* ``tritonforge_loadtest_inter_token_latency_seconds`` -- histogram
* ``tritonforge_loadtest_output_tokens_total`` -- counter
* ``tritonforge_loadtest_requests_total`` -- counter, label ``outcome`` (success|failure)
* ``tritonforge_loadtest_users`` -- gauge

Every exporter has its own registry, so several can live in one process (tests) and none
pollutes the global ``prometheus_client`` registry. All methods are thread-safe (they only
touch ``prometheus_client`` metrics) and cheap enough to call from a Locust event handler.
"""

from __future__ import annotations

import math
import threading
from types import TracebackType
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from typing_extensions import Self

__all__ = [
    "DEFAULT_PORT",
    "LOADTEST_METRIC_NAMES",
    "METRIC_ITL",
    "METRIC_OUTPUT_TOKENS",
    "METRIC_REQUESTS",
    "METRIC_TTFT",
    "METRIC_USERS",
    "Exporter",
    "start_exporter",
]

DEFAULT_PORT: Final = 9646

METRIC_TTFT: Final = "tritonforge_loadtest_time_to_first_token_seconds"
METRIC_ITL: Final = "tritonforge_loadtest_inter_token_latency_seconds"
# prometheus_client appends ``_total`` to counters; these are the names as exposed.
METRIC_OUTPUT_TOKENS: Final = "tritonforge_loadtest_output_tokens_total"
METRIC_REQUESTS: Final = "tritonforge_loadtest_requests_total"
METRIC_USERS: Final = "tritonforge_loadtest_users"

#: The series names a scrape of the exporter shows (histograms expand to these suffixes).
LOADTEST_METRIC_NAMES: Final[frozenset[str]] = frozenset(
    {f"{h}{s}" for h in (METRIC_TTFT, METRIC_ITL) for s in ("_bucket", "_sum", "_count")}
    | {METRIC_OUTPUT_TOKENS, METRIC_REQUESTS, METRIC_USERS}
)

_TTFT_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
    10.0, 20.0, 30.0, 60.0,
)
_ITL_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 0.75, 1.0, 2.5, 5.0,
)


def _base(name: str) -> str:
    return name.removesuffix("_total")


class Exporter:
    """Load-test metrics on their own registry, served over HTTP by :func:`start_exporter`.

    Construct it directly (without serving) to collect into ``registry`` only, e.g. to
    render with ``prometheus_client.generate_latest(exporter.registry)``.
    """

    def __init__(self, model: str = "", registry: CollectorRegistry | None = None) -> None:
        self.model = model
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._server: object | None = None
        self._thread: threading.Thread | None = None
        self.host = ""
        self.port = 0
        ttft = Histogram(
            METRIC_TTFT, "Client-side time to first token, seconds.", ["model"],
            registry=self.registry, buckets=_TTFT_BUCKETS,
        )
        itl = Histogram(
            METRIC_ITL, "Client-side time between consecutive tokens, seconds.", ["model"],
            registry=self.registry, buckets=_ITL_BUCKETS,
        )
        tokens = Counter(
            _base(METRIC_OUTPUT_TOKENS), "Output tokens received by the load test.", ["model"],
            registry=self.registry,
        )
        requests = Counter(
            _base(METRIC_REQUESTS), "Finished load-test requests by outcome.",
            ["model", "outcome"], registry=self.registry,
        )
        users = Gauge(
            METRIC_USERS, "Simulated users currently running.", ["model"], registry=self.registry
        )
        self._ttft = ttft.labels(model=model)
        self._itl = itl.labels(model=model)
        self._tokens = tokens.labels(model=model)
        self._ok = requests.labels(model=model, outcome="success")
        self._failed = requests.labels(model=model, outcome="failure")
        self._users = users.labels(model=model)

    # -- recording -------------------------------------------------------------------------
    def observe_ttft(self, seconds: float) -> None:
        """Record one request's time to first token (NaN/inf ignored, negatives as 0)."""
        if math.isfinite(seconds):
            self._ttft.observe(max(0.0, float(seconds)))

    def observe_itl(self, seconds: float) -> None:
        """Record one inter-token gap (call once per gap, or once per request with its mean)."""
        if math.isfinite(seconds):
            self._itl.observe(max(0.0, float(seconds)))

    def add_output_tokens(self, n: int) -> None:
        """Count ``n`` received output tokens (negative values are ignored)."""
        if n > 0:
            self._tokens.inc(n)

    def add_request(self, success: bool) -> None:
        """Count one finished request as a success or a failure."""
        (self._ok if success else self._failed).inc()

    def set_users(self, n: int) -> None:
        """Set the number of simulated users currently running."""
        self._users.set(max(0, int(n)))

    # -- serving ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The scrape URL, or ``""`` when not serving."""
        if not self.port:
            return ""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/metrics"

    def _serve(self, port: int, host: str) -> None:
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server, self._thread = server, thread
        self.host, self.port = host, int(server.server_port)

    def close(self) -> None:
        """Stop serving; recording keeps working (into the registry only)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.port = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def start_exporter(port: int = DEFAULT_PORT, *, model: str = "", host: str = "0.0.0.0") -> Exporter:
    """Create an :class:`Exporter` and serve it on ``host:port`` (``port=0``: a free port).

    Raises ``OSError`` when the port is taken.
    """
    exporter = Exporter(model=model)
    exporter._serve(port, host)
    return exporter
