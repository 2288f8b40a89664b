"""``serve``'s HTTP front (``runtime.front``) answers as Triton's own HTTP port does.

The shared test server runs behind the front (as ``tritonforge serve`` does); here each request
is sent to both the front and tritonserver's private HTTP port, and status, content type and
body must be the same (greedy decoding, so the texts are comparable). That the front's key
makes a non-streamed call cancellable is tested on a real ``serve`` by
``tests/test_reliability_drops.py`` (kind ``sync-http``), with the server's CPU as the oracle.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from tritonforge.contract import FRONT_KEY_PARAMETER
from tritonforge.runtime.front import ReservedKey, with_front_key

KEY = "0123456789abcdef0123456789abcdef"


def test_the_key_is_added_and_every_other_byte_kept() -> None:
    body = b'  {"text_input": "a,b}", "max_tokens": 1.50e1}'
    tagged = with_front_key(body, KEY)
    assert tagged is not None
    assert json.loads(tagged) == {FRONT_KEY_PARAMETER: KEY, "text_input": "a,b}", "max_tokens": 15.0}
    assert tagged.replace(f'"{FRONT_KEY_PARAMETER}": "{KEY}",'.encode(), b"") == body
    assert json.loads(with_front_key(b"{ }", KEY) or b"") == {FRONT_KEY_PARAMETER: KEY}


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"', b""])
def test_a_body_that_is_no_json_object_is_passed_on_as_it_is(body: bytes) -> None:
    assert with_front_key(body, KEY) is None


def test_a_client_cannot_send_the_fronts_key() -> None:
    with pytest.raises(ReservedKey, match=FRONT_KEY_PARAMETER):
        with_front_key(json.dumps({"text_input": "x", FRONT_KEY_PARAMETER: KEY}).encode(), KEY)


def _both(server: Any, method: str, path: str, **kw: Any) -> tuple[httpx.Response, httpx.Response]:
    if server.server is None:
        pytest.skip("TRITONFORGE_TEST_SERVER names a server started elsewhere: no private port known")
    private = f"127.0.0.1:{server.server.triton_http_port}"
    assert private != server.http_url, "the shared server is not behind the front"
    with httpx.Client(timeout=120) as http:
        return (http.request(method, f"http://{server.http_url}{path}", **kw),
                http.request(method, f"http://{private}{path}", **kw))


def _same(front: httpx.Response, triton: httpx.Response) -> None:
    assert front.status_code == triton.status_code, (front.text, triton.text)
    assert front.headers.get("content-type") == triton.headers.get("content-type")
    assert front.content == triton.content


@pytest.mark.server
@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v2/health/ready", None),
    ("GET", "/v2/models/{m}_sync", None),
    ("GET", "/v2/models/{m}_sync/config", None),
    ("GET", "/v2/models/nonexistent", None),
    ("POST", "/v2/repository/index", {}),  # an admin API: closed without the key, both ways
    ("POST", "/v2/models/{m}_sync/generate", {"text_input": "Name a colour.", "max_tokens": 8, "temperature": 0}),
    ("POST", "/v2/models/{m}_sync/generate", {"text_input": "Hi", "max_tokens": 4, "temprature": 0}),
    ("POST", "/v2/models/{m}_sync/generate", "not json"),
    ("POST", "/v2/models/{m}_sync/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["Name a colour."]},
        {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [8]},
        {"name": "temperature", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}),
    ("POST", "/v2/models/{m}/generate_stream", {"text_input": "Name a colour.", "max_tokens": 8, "temperature": 0}),
])
def test_the_front_answers_as_triton_does(triton_server: Any, method: str, path: str, body: Any) -> None:
    path = path.format(m=triton_server.model)
    kw: dict[str, Any] = {}
    if isinstance(body, str):
        kw["content"] = body.encode()
    elif body is not None:
        kw["json"] = body
    front, triton = _both(triton_server, method, path, **kw)
    _same(front, triton)


@pytest.mark.server
def test_the_front_refuses_its_own_key_from_a_client(triton_server: Any) -> None:
    with httpx.Client(timeout=60) as http:
        reply = http.post(f"http://{triton_server.http_url}/v2/models/{triton_server.model}_sync/generate",
                          json={"text_input": "Hi", "max_tokens": 2, FRONT_KEY_PARAMETER: KEY})
    assert reply.status_code == 400
    assert FRONT_KEY_PARAMETER in reply.json()["error"]
