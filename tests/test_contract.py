"""The contract: the request-parameter table and what is derived from it, the error tags."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from tritonforge import contract as C
from tritonforge import docsync
from tritonforge.clients import Request
from tritonforge.clients._models import GUIDE_FIELDS, REQUEST_TENSORS, RequestOverrides

ROOT = Path(__file__).resolve().parents[1]


def test_generated_docs_are_in_sync() -> None:
    """docs/requests.md (this table) and docs/generator.md (the spec schema) embed generated
    sections; both must equal what their sources render now."""
    assert docsync.stale_sections() == [], "stale: python -m tritonforge.docsync --write"
    text = (ROOT / "docs" / "requests.md").read_text()
    assert all(f"`{p.name}`" in text for p in C.REQUEST_PARAMETERS)


def test_every_row_derives_its_tensors() -> None:
    ensemble = C.by_name(C.ENSEMBLE_INPUTS)
    engine = C.by_name(C.ENGINE_INPUTS)
    assert [t.name for t in C.ENSEMBLE_INPUTS] == [p.name for p in C.REQUEST_PARAMETERS]
    for p in C.REQUEST_PARAMETERS:
        assert ensemble[p.name].dtype is p.dtype and ensemble[p.name].optional
        if p.engine_name is not None:
            assert p.engine_name in engine
            assert C.pre_output(p.engine_name) in {t.name for t in C.PREPROCESSING_OUTPUTS}
    # every engine input is fed by a row, or is the engine's own
    own = {"input_ids", "input_lengths", "stop", "embedding_bias"}
    assert set(engine) - own == {p.engine_name for p in C.REQUEST_PARAMETERS if p.engine_name}


def test_client_request_fields_are_the_tables() -> None:
    fields = {f.name for f in dataclasses.fields(Request)} - {"request_id", "timeout"} - set(GUIDE_FIELDS)
    assert fields == set(REQUEST_TENSORS) == {p.client for p in C.REQUEST_PARAMETERS if p.client}
    assert set(GUIDE_FIELDS) == {g.client for g in C.GUIDES}
    fields |= set(GUIDE_FIELDS)
    assert set(RequestOverrides.__annotations__) - {"request_id", "timeout"} == fields


@pytest.mark.parametrize(("values", "param", "fragment"), [
    ({"top_p": 0.0}, "top_p", "top_p must be a number in (0, 1]"),
    ({"top_p": 1.0}, None, None),
    ({"min_p": 1.01}, "min_p", "min_p must be a number in [0, 1]"),
    ({"top_k": 3.5}, "top_k", "must be an integer"),
    ({"max_tokens": True}, "max_tokens", "must be an integer"),
    ({"temperature": float("nan")}, "temperature", "finite"),
    ({"seed": 2**64}, "seed", "seed must be"),
    ({"seed": 2**64 - 1}, None, None),
    ({"stream": 1}, "stream", "true or false"),
    ({"stop_words": ["a", ""]}, "stop_words", "empty word"),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", "<= max_tokens"),
    ({"temprature": 0.3}, "temprature", "did you mean temperature"),
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[a-z]+"}, None, None),
    ({"guided_decoding_guide_type": "json"}, None, None),
    ({"guided_decoding_guide_type": "yaml"}, "guided_decoding_guide_type", "must be one of json, json_schema"),
    ({"guided_decoding_guide": "[a-z]+"}, "guided_decoding_guide_type", "needs guided_decoding_guide_type"),
    ({"guided_decoding_guide_type": "regex"}, "guided_decoding_guide", "regex needs a guide"),
    ({"guided_decoding_guide_type": "json", "guided_decoding_guide": "{}"}, "guided_decoding_guide",
     "json takes no guided_decoding_guide"),
    ({"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "{'a'"}, "guided_decoding_guide",
     "is not valid JSON"),
    ({"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "[]"}, "guided_decoding_guide",
     "must be a JSON object"),
    ({"guided_decoding_guide_type": "choice", "guided_decoding_guide": '["a", ""]'}, "guided_decoding_guide",
     "JSON list of non-empty strings"),
])
def test_check_request_values(values: dict, param: str | None, fragment: str | None) -> None:  # type: ignore[type-arg]
    if param is None:
        C.check_request_values(values)
        return
    with pytest.raises(C.ParameterError, match=re.escape(fragment or "")) as info:
        C.check_request_values(values)
    assert info.value.param == param


def test_engine_capabilities_refuse_rather_than_drop() -> None:
    C.check_request_values({"min_p": 0.2}, engine=C.EngineKind.VLLM)
    with pytest.raises(C.ParameterError, match="min_p is not supported"):
        C.check_request_values({"min_p": 0.2}, engine=C.EngineKind.TRTLLM_CPP)
    C.check_request_values({"min_p": 0.0, "beam_width": 1}, engine=C.EngineKind.TRTLLM_CPP)
    with pytest.raises(C.ParameterError, match="beam_width"):
        C.check_request_values({"beam_width": 2}, engine=C.EngineKind.VLLM)
    assert "min_p" not in C.engine_inputs_for(C.EngineKind.TRTLLM_CPP)
    assert "lora_task_id" not in C.engine_inputs_for(C.EngineKind.VLLM)
    assert "lora_task_id" in C.engine_inputs_for(C.EngineKind.VLLM, ("lora",))
    guide = {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[0-9]+"}
    for engine in C.ENGINE_KINDS:  # guides, several sequences, log-probabilities: every engine
        C.check_request_values({**guide, "num_return_sequences": 2, "return_log_probs": True}, engine=engine)
        assert {"guided_decoding_guide", "num_return_sequences", "return_log_probs"} <= set(
            C.engine_inputs_for(engine))
    C.check_request_values({"top_logprobs": 2}, engine=C.EngineKind.TRTLLM_LLMAPI)
    with pytest.raises(C.ParameterError, match="top_logprobs is not supported .*no alternatives"):
        C.check_request_values({"top_logprobs": 2}, engine=C.EngineKind.TRTLLM_CPP)
    assert "top_logprobs" not in C.engine_inputs_for(C.EngineKind.TRTLLM_CPP)


def test_client_guides_encode_into_the_two_guide_inputs() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert Request(prompt="x", json_schema=schema).inputs()["guided_decoding_guide"] == '{"type": "object", "properties": {"n": {"type": "integer"}}}'
    assert Request(prompt="x", choice=["a", "b"]).inputs()["guided_decoding_guide_type"] == "choice"
    assert Request(prompt="x", json_object=True).inputs()["guided_decoding_guide"] == ""
    assert "guided_decoding_guide_type" not in Request(prompt="x", json_object=False).inputs()


def test_unknown_request_parameters() -> None:
    C.check_request_parameters({"id": "1", "triton_enable_empty_final_response": True, "priority": 2})
    with pytest.raises(C.ParameterError, match="did you mean top_p") as info:
        C.check_request_parameters({"top_pp": 0.5})
    assert info.value.param == "top_pp"


@pytest.mark.parametrize("kind", list(C.ErrorKind))
def test_error_tags_round_trip(kind: C.ErrorKind) -> None:
    text = "in ensemble 'm', " + C.format_error(kind, "top_p must be in (0, 1]; got 2", "top_p")
    info = C.parse_error(text)
    assert info == C.ErrorInfo(kind, "top_p must be in (0, 1]; got 2", "top_p")
    assert C.parse_error(C.format_error(kind, "x")) == C.ErrorInfo(kind, "x", None)
    assert kind.triton_code in {"INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL"}


def test_untagged_errors_are_not_guessed() -> None:
    assert C.parse_error("engine error: invalid request id") is None
    assert C.parse_error("[tritonforge:no_such_kind] x") is None


@pytest.mark.parametrize("text", [
    "in ensemble 'smollm2', Stub process 'postprocessing_0_0' is not healthy.",  # seen in CI
    ("Failed to process the request(s) for model instance 'preprocessing_0_0', message: "
     "Stub process is not healthy."),
    "Failed to obtain the health mutex.",
])
def test_the_python_backends_own_failures_are_internal(text: str) -> None:
    """A stub that missed Triton's health deadline failed a valid request: a server error,
    never a refused request (the typed clients read it as ServerError)."""
    assert C.parse_error(text) == C.ErrorInfo(C.ErrorKind.INTERNAL, text)


def test_stop_request_is_the_engines_required_inputs_and_stop() -> None:
    names = [n for n, _, _ in C.STOP_REQUEST]
    engine = C.by_name(C.ENGINE_INPUTS)
    assert "stop" in names
    assert {t.name for t in C.ENGINE_INPUTS if not t.optional} <= set(names)
    for name, dtype, _ in C.STOP_REQUEST:
        assert engine[name].dtype is dtype


def test_messages_carry_tool_calls_and_tool_call_ids_to_the_template() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    msgs = C.parse_messages(json.dumps([{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": None, "tool_calls": [call]},
                                        {"role": "tool", "tool_call_id": "c1", "content": "3"}]))
    assert msgs[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert msgs[2] == {"role": "tool", "content": "3", "tool_call_id": "c1"}
    for bad, fragment in [
        ([{"role": "user", "content": "x", "tool_calls": [call]}], "unknown keys: tool_calls"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}],
         "messages[0].tool_calls[0] must be"),
        ([{"role": "tool", "content": "3", "tool_call_id": 7}], "tool_call_id must be a string"),
    ]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            C.parse_messages(json.dumps(bad))
