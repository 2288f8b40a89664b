"""The load test's own command-line options (Locust custom arguments) and their settings.

Every option can also come from an environment variable (shown in ``locust --help``) or
from Locust's ``--config`` file (``model = smollm2``). The compose file sets the
``TRITONFORGE_TRITON_*``, ``TRITONFORGE_MODEL`` and ``TRITONFORGE_PROMETHEUS_PORT``
variables. Nothing here imports Locust: ``add_arguments`` takes Locust's parser.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from tritonforge.loadtests.gates import Gates
from tritonforge.loadtests.tokens import DEFAULT_TOKENIZER

__all__ = ["Protocol", "Settings", "SettingsError", "Shape", "add_arguments", "settings_from"]


class Protocol(str, enum.Enum):
    """Which user class runs: gRPC streaming, HTTP SSE streaming, HTTP non-streaming, all."""

    GRPC = "grpc"
    HTTP = "http"
    HTTP_SYNC = "http-sync"
    ALL = "all"


class Shape(str, enum.Enum):
    CONSTANT = "constant"
    RAMP = "ramp"
    STEP = "step"


class SettingsError(Exception):
    """A missing or invalid setting; the message names the option and the fix."""


DEFAULT_PROMETHEUS_PORT: Final = 9646


def add_arguments(parser: Any) -> None:
    """Register the options on Locust's parser (``events.init_command_line_parser``)."""
    g = parser.add_argument_group("tritonforge")

    def add(*flags: str, **kw: Any) -> None:
        g.add_argument(*flags, **kw)

    add("--protocol", choices=[p.value for p in Protocol], default="grpc",
        env_var="TRITONFORGE_PROTOCOL",
        help="Users to run: grpc (streaming), http (SSE streaming), http-sync (non-streaming"
             " /generate on <model>_sync), all. Ignored when user classes are named.")
    add("--triton-grpc", default="127.0.0.1:8001", env_var="TRITONFORGE_TRITON_GRPC",
        help="Triton's gRPC address HOST:PORT.")
    add("--triton-http", default="127.0.0.1:8000", env_var="TRITONFORGE_TRITON_HTTP",
        help="Triton's HTTP address HOST:PORT (or http://HOST:PORT).")
    add("--model", default="", env_var="TRITONFORGE_MODEL",
        help="Ensemble to load (required unless the server lets the client discover it"
             " with TRITONFORGE_ADMIN_KEY).")
    add("--sync-model", default="", env_var="TRITONFORGE_SYNC_MODEL",
        help="Non-decoupled model for http-sync (default: <model>_sync).")
    add("--dataset", default="short-chat", env_var="TRITONFORGE_DATASET",
        help="short-chat, long-summarization, mixed-zh-en, synthetic:N (N-token prompts)"
             " or a JSONL path.")
    add("--max-tokens", type=int, default=0, env_var="TRITONFORGE_MAX_TOKENS",
        help="Output tokens to ask for (0: each prompt's own max_tokens, else the server's"
             " default).")
    add("--ignore-eos", action="store_true", default=False, env_var="TRITONFORGE_IGNORE_EOS",
        help="Generate exactly --max-tokens tokens per request (min_tokens = max_tokens), as"
             " benchmark tools' ignore_eos does, so runs compare equal work.")
    add("--tokenizer", default=DEFAULT_TOKENIZER, env_var="TRITONFORGE_TOKENIZER",
        help="The served model's tokenizer (model reference or HF folder), used to count"
             " output tokens.")
    add("--request-timeout", type=float, default=300.0, env_var="TRITONFORGE_REQUEST_TIMEOUT",
        help="Per-request deadline, seconds.")
    add("--prompt-seed", type=int, default=0, help="Seed for prompt order and synthetic prompts.")
    add("--shape", choices=[s.value for s in Shape], default="constant",
        env_var="TRITONFORGE_SHAPE",
        help="constant: -u users at -r/s; ramp: up over --ramp-seconds, hold, down at the"
             " end; step: +--step-users every --step-seconds up to -u. Ends at -t.")
    add("--ramp-seconds", type=float, default=0.0, help="Ramp duration (0: a quarter of -t).")
    add("--step-users", type=int, default=1, help="Users added per step.")
    add("--step-seconds", type=float, default=10.0, help="Seconds per step.")
    add("--slo-ttft-p95-ms", type=float, default=None,
        help="Gate: fail the run when TTFT p95 exceeds this (ms).")
    add("--slo-itl-p95-ms", type=float, default=None,
        help="Gate: fail the run when inter-token latency p95 exceeds this (ms).")
    add("--max-fail-ratio", type=float, default=None,
        help="Gate: fail the run when failed/total requests exceeds this (0..1).")
    add("--results-dir", default="", env_var="TRITONFORGE_RESULTS_DIR",
        help="Folder for summary.json and the PNG plots (default: the --csv prefix's folder).")
    add("--prometheus-port", type=int, default=DEFAULT_PROMETHEUS_PORT,
        env_var="TRITONFORGE_PROMETHEUS_PORT",
        help="Master's Prometheus exporter port (0: a free port, -1: off).")


@dataclass(frozen=True)
class Settings:
    protocol: Protocol
    grpc_url: str
    http_url: str
    model: str
    sync_model: str
    dataset: str
    max_tokens: int | None
    ignore_eos: bool
    tokenizer: str
    request_timeout: float
    prompt_seed: int
    shape: Shape
    ramp_seconds: float
    step_users: int
    step_seconds: float
    gates: Gates
    results_dir: str
    prometheus_port: int


def _address(value: str, flag: str) -> str:
    v = value.strip().removeprefix("http://").removeprefix("grpc://").rstrip("/")
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingsError(f"{flag} must be HOST:PORT, got {value!r}")
    return v


def settings_from(opts: Any) -> Settings:
    """Validate the parsed options; raises :class:`SettingsError` with a one-line message."""
    def get(name: str, default: Any = None) -> Any:
        return getattr(opts, name, default)

    for flag, name, lo, hi in (
        ("--slo-ttft-p95-ms", "slo_ttft_p95_ms", 0.0, None),
        ("--slo-itl-p95-ms", "slo_itl_p95_ms", 0.0, None),
        ("--max-fail-ratio", "max_fail_ratio", 0.0, 1.0),
    ):
        v = get(name)
        if v is not None and (v < lo or (hi is not None and v > hi)):
            rng = f"[{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise SettingsError(f"{flag} must be {rng}, got {v:g}")
    max_tokens = int(get("max_tokens", 0) or 0)
    if max_tokens < 0:
        raise SettingsError(f"--max-tokens must be >= 0, got {max_tokens}")
    ignore_eos = bool(get("ignore_eos", False))
    if ignore_eos and not max_tokens:
        raise SettingsError("--ignore-eos needs --max-tokens (the exact number of tokens to generate)")
    timeout = float(get("request_timeout", 300.0))
    if not timeout > 0:
        raise SettingsError(f"--request-timeout must be > 0 seconds, got {timeout:g}")
    step_users, step_seconds = int(get("step_users", 1)), float(get("step_seconds", 10.0))
    if step_users < 1 or step_seconds <= 0:
        raise SettingsError("--step-users must be >= 1 and --step-seconds > 0")
    model = str(get("model", "") or "").strip()
    return Settings(
        protocol=Protocol(get("protocol", "grpc")),
        grpc_url=_address(str(get("triton_grpc", "127.0.0.1:8001")), "--triton-grpc"),
        http_url=_address(str(get("triton_http", "127.0.0.1:8000")), "--triton-http"),
        model=model,
        sync_model=str(get("sync_model", "") or "").strip() or (f"{model}_sync" if model else ""),
        dataset=str(get("dataset", "short-chat")),
        max_tokens=max_tokens or None,
        ignore_eos=ignore_eos,
        tokenizer=str(get("tokenizer", DEFAULT_TOKENIZER)),
        request_timeout=timeout,
        prompt_seed=int(get("prompt_seed", 0)),
        shape=Shape(get("shape", "constant")),
        ramp_seconds=max(0.0, float(get("ramp_seconds", 0.0))),
        step_users=step_users,
        step_seconds=step_seconds,
        gates=Gates(get("slo_ttft_p95_ms"), get("slo_itl_p95_ms"), get("max_fail_ratio")),
        results_dir=str(get("results_dir", "") or ""),
        prometheus_port=int(get("prometheus_port", DEFAULT_PROMETHEUS_PORT)),
    )
