"""Postprocessing's finish reason for the TensorRT-LLM C++ engine (which reports none), the
request facts preprocessing leaves for it, and the LLM-API adapter's mapping -- pure logic,
no server (issue 12)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tritonforge import contract as C
from tritonforge.triton_models.detokenize import make_decoder
from tritonforge.triton_models.engine.request import EngineRequest
from tritonforge.triton_models.postprocess import Postprocessor
from tritonforge.triton_models.preprocess import Preprocessor, PreprocessSettings, load_tokenizer
from tritonforge.triton_models.request_facts import FactsStore, RequestFacts

STANDINS = Path(__file__).with_name("standins")


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return load_tokenizer("package:smollm2-135m-instruct")


def _cpp_response(ids: list[int]) -> dict[str, np.ndarray]:
    """What the C++ backend's outputs give postprocessing: ids and their count only."""
    return {"output_ids": np.array([[ids]], dtype=np.int32).reshape(1, 1, len(ids)),
            "sequence_length": np.array([[len(ids)]], dtype=np.int32)}


def _post(tok, store: FactsStore) -> Postprocessor:  # type: ignore[no-untyped-def]
    return Postprocessor(make_decoder(tok), tok.eos_token_id, facts=store.get, drop_facts=store.drop)


def _stream(post: Postprocessor, rid: str, chunks: list[list[int]]) -> tuple[str, list[str]]:
    text, reasons = "", []
    for c in chunks:
        r = post.process(_cpp_response(c), rid)
        text += r.text
        reasons.append(r.finish_reason)
    return text, reasons


def _facts(tok, prompt: str, *, max_tokens: int, stop: list[str] = (), streaming: bool = True,  # type: ignore[no-untyped-def]
           exclude: bool = True) -> tuple[RequestFacts, list[int]]:
    pre = Preprocessor(PreprocessSettings(model="x", engine=C.EngineKind.TRTLLM_CPP), tok)
    inputs = {"text_input": np.array([[prompt.encode()]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32),
              "exclude_input_in_output": np.array([[exclude]], dtype=bool)}
    if stop:
        inputs["stop_words"] = np.array([[w.encode() for w in stop]], dtype=object)
    out = pre.process(inputs)
    return RequestFacts.from_preprocessed(out, streaming=streaming), out[C.pre_output("input_ids")][0].tolist()


def test_facts_come_from_what_preprocessing_filled(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    facts, ids = _facts(tok, "Hello there", max_tokens=7, stop=["\n\n", "User:"])
    assert facts.max_tokens == 7 and facts.end_id == tok.eos_token_id and facts.n_input == len(ids)
    assert [list(w) for w in facts.stop_words] == [tok.encode("\n\n", add_special_tokens=False),
                                                   tok.encode("User:", add_special_tokens=False)]
    store = FactsStore(tmp_path / "facts")
    store.put("req-1", facts)
    assert store.get("req-1") == facts and store.count() == 1
    store.drop("req-1")
    assert store.get("req-1") is None and store.count() == 0
    store.put("old", facts)
    assert store.sweep(now=1e12) == 1 and store.count() == 0


def test_length_stop_word_end_id_and_empty_last_response(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FactsStore(tmp_path / "facts")
    post = _post(tok, store)
    words = tok.encode(" one two three four five", add_special_tokens=False)

    facts, _ = _facts(tok, "Count:", max_tokens=len(words))
    store.put("len", facts)
    text, reasons = _stream(post, "len", [[w] for w in words])
    assert reasons == [""] * (len(words) - 1) + ["length"]
    assert text == tok.decode(words)

    stop_ids = tok.encode(" three", add_special_tokens=False)
    facts, _ = _facts(tok, "Count:", max_tokens=50, stop=[" three"])
    store.put("stop", facts)
    upto = words[: words.index(stop_ids[0]) + len(stop_ids)]  # the backend returns the stop word
    text, reasons = _stream(post, "stop", [[w] for w in upto])
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {""}
    assert text == " one two" and "three" not in text

    facts, _ = _facts(tok, "Count:", max_tokens=50)
    store.put("eos", facts)
    text, reasons = _stream(post, "eos", [[words[0]], [words[1], tok.eos_token_id]])
    assert reasons == ["", "stop"] and text == tok.decode(words[:2])
    store.put("empty", facts)  # end_id left out: the last streamed response is empty
    text, reasons = _stream(post, "empty", [[words[0]], [words[1]], []])
    assert reasons == ["", "", "stop"] and text == tok.decode(words[:2])

    facts, _ = _facts(tok, "Count:", max_tokens=50, streaming=False)
    store.put("one", facts)
    r = post.process(_cpp_response(words[:3]), "one")
    assert r.finish_reason == "stop" and r.text == tok.decode(words[:3])
    assert r.num_input_tokens == facts.n_input  # the C++ engine reports none

    assert post.open_requests == 0 and store.count() == 0


def test_echoed_prompt_is_not_counted_against_max_tokens(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FactsStore(tmp_path / "facts")
    post = _post(tok, store)
    facts, prompt = _facts(tok, "Count:", max_tokens=2, exclude=False, streaming=False)
    store.put("echo", facts)
    gen = tok.encode(" one two", add_special_tokens=False)[:2]
    r = post.process(_cpp_response(prompt + gen), "echo")
    assert r.finish_reason == "length" and r.text == tok.decode(prompt + gen)


def test_cancel_and_engines_with_a_finish_reason_free_state(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FactsStore(tmp_path / "facts")
    post = _post(tok, store)
    facts, _ = _facts(tok, "Count:", max_tokens=50)
    store.put("gone", facts)
    post.process(_cpp_response([42]), "gone")
    assert post.open_requests == 1
    post.forget(_cpp_response([]), "gone")
    assert post.open_requests == 0 and store.count() == 0
    # tritonforge's engines send their key and finish reason: facts are never consulted
    seen: list[str] = []
    post.finished = seen.append
    keyed = {**_cpp_response([42]), "engine_request_key": np.array([[7]], dtype=np.uint64),
             "engine_finish_reason": np.array([[b""]], dtype=object)}
    post.process(keyed, "vllm-req")
    keyed["engine_finish_reason"] = np.array([[b"length"]], dtype=object)
    assert post.process(keyed, "vllm-req").finish_reason == "length"
    assert post.open_requests == 0 and seen == ["length"]


def _seq(ids: list[int], seq: int, lps: list[float] | None = None) -> dict[str, np.ndarray]:
    """The C++ backend's response for sequence ``seq`` (sequence_index only when several are
    asked for, output_log_probs only with return_log_probs)."""
    out = {**_cpp_response(ids), "engine_sequence_index": np.array([[seq]], dtype=np.int32)}
    if lps is not None:
        out["engine_output_log_probs"] = np.array([lps], dtype=np.float32).reshape(1, 1, len(lps))
    return out


def test_several_sequences_end_on_their_own_and_free_the_request_after_the_last(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FactsStore(tmp_path / "facts")
    post = _post(tok, store)
    pre = Preprocessor(PreprocessSettings(model="x", engine=C.EngineKind.TRTLLM_CPP), tok)
    out = pre.process({"text_input": np.array([[b"Count:"]], dtype=object),
                       "max_tokens": np.array([[3]], dtype=np.int32),
                       "num_return_sequences": np.array([[2]], dtype=np.int32),
                       "stop_words": np.array([[b" three"]], dtype=object)})
    facts = RequestFacts.from_preprocessed(out, streaming=True)
    assert facts.n == 2 and out[C.pre_output("num_return_sequences")].item() == 2
    store.put("n2", facts)
    one, two, three = (tok.encode(w, add_special_tokens=False)[0] for w in (" one", " two", " three"))
    # interleaved: sequence 1 stops at the stop word (returned by the backend, dropped here,
    # with its log-probability), sequence 0 runs to max_tokens
    r = [post.process(_seq([one], 0, [-0.5]), "n2"), post.process(_seq([two], 1, [-1.0]), "n2"),
         post.process(_seq([three], 1, [-2.0]), "n2")]
    assert [(x.sequence_index, x.text, x.finish_reason, x.logprobs) for x in r] == [
        (0, " one", "", (-0.5,)), (1, " two", "", (-1.0,)), (1, "", "stop", ())]
    assert post.open_requests == 1 and store.count() == 1  # sequence 0 still runs: facts kept
    r = [post.process(_seq([two], 0, [-0.25]), "n2"), post.process(_seq([two], 0, [-0.75]), "n2")]
    assert [(x.text, x.finish_reason, x.logprobs) for x in r] == [(" two", "", (-0.25,)),
                                                                   (" two", "length", (-0.75,))]
    assert post.open_requests == 0 and store.count() == 0
    # a token held back (it could begin a stop word) goes out later with its log-probability
    facts, _ = _facts(tok, "Count:", max_tokens=50, stop=[" two three"])
    store.put("held", facts)
    r = [post.process(_seq([two], 0, [-1.0]), "held"), post.process(_seq([one], 0, [-0.5]), "held")]
    assert [(x.text, x.logprobs) for x in r] == [("", ()), (" two one", (-1.0, -0.5))]


def test_a_cancelled_request_frees_every_sequence_at_once(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Three sequences streaming (tritonforge's engine: keyed, with sequence_index); the client
    goes; postprocessing's cancelled request carries one sequence's inputs -- all go."""
    post = _post(tok, FactsStore(tmp_path / "facts"))
    word = tok.encode(" one", add_special_tokens=False)
    for seq in range(3):
        post.process({**_seq(word, seq), "engine_request_key": np.array([[9]], dtype=np.uint64),
                      "engine_finish_reason": np.array([[b""]], dtype=object)}, "n3")
    assert post.open_requests == 1
    post.forget({**_seq([], 1), "engine_request_key": np.array([[9]], dtype=np.uint64)}, "n3")
    assert post.open_requests == 0
    # the engine ended it (stopped by the client's id): its one "cancelled" answer ends all three
    for seq in range(3):
        post.process({**_seq(word, seq), "engine_request_key": np.array([[10]], dtype=np.uint64),
                      "engine_finish_reason": np.array([[b""]], dtype=object)}, "n3")
    post.process({**_seq([], 0), "engine_request_key": np.array([[10]], dtype=np.uint64),
                  "engine_finish_reason": np.array([[b"cancelled"]], dtype=object)}, "n3")
    assert post.open_requests == 0
    # the C++ path (no key): by request id, facts too
    store = FactsStore(tmp_path / "cpp")
    post = _post(tok, store)
    facts, _ = _facts(tok, "Count:", max_tokens=50)
    store.put("cpp-n3", RequestFacts(**{**facts.__dict__, "n": 3}))
    for seq in range(3):
        post.process(_seq(word, seq), "cpp-n3")
    post.forget(_seq([], 2), "cpp-n3")
    assert post.open_requests == 0 and store.count() == 0


def test_guides_are_lowered_to_tensorrt_llms_guide_types(tok) -> None:  # type: ignore[no-untyped-def]
    """choice has no TensorRT-LLM guide type and its JSON grammars allow free whitespace:
    preprocessing sends those as an EBNF grammar (compact JSON) that xgrammar accepts exactly
    where the guide does; the vLLM engine gets the guide as sent."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string as accepts

    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    cases = [("choice", '["red", "a \\"b\\"", "é\\nx"]', ["red", 'a "b"', "é\nx"], ["blue", "re"]),
             ("json_schema", schema, ['{"a": 1}'], ['{ "a": 1}', '{"a": "1"}', "[1]"]),
             ("json", "", ['{"b": [1, 2]}', "{}"], ["[1]", "1"])]
    for engine in (C.EngineKind.TRTLLM_CPP, C.EngineKind.TRTLLM_LLMAPI):
        pre = Preprocessor(PreprocessSettings(model="x", engine=engine), tok)
        for guide_type, guide, good, bad in cases:
            out = pre.process({"text_input": np.array([[b"hi"]], dtype=object),
                               "guided_decoding_guide_type": np.array([[guide_type.encode()]], dtype=object),
                               "guided_decoding_guide": np.array([[guide.encode()]], dtype=object)})
            sent_type = out[C.pre_output("guided_decoding_guide_type")].item().decode()
            sent = out[C.pre_output("guided_decoding_guide")].item().decode()
            assert sent_type == "ebnf_grammar" and sent_type in {t.value for t in C.TRTLLM_GUIDE_TYPES}
            grammar = xgrammar.Grammar.from_ebnf(sent)
            assert all(accepts(grammar, g) for g in good), (guide_type, sent)
            assert not any(accepts(grammar, b) for b in bad), (guide_type, sent)
        out = pre.process({"text_input": np.array([[b"hi"]], dtype=object),
                           "guided_decoding_guide_type": np.array([[b"regex"]], dtype=object),
                           "guided_decoding_guide": np.array([[b"[0-9]+"]], dtype=object)})
        assert out[C.pre_output("guided_decoding_guide")].item() == b"[0-9]+"  # TensorRT-LLM's own type
    vllm = Preprocessor(PreprocessSettings(model="x"), tok).process({
        "text_input": np.array([[b"hi"]], dtype=object),
        "guided_decoding_guide_type": np.array([[b"choice"]], dtype=object),
        "guided_decoding_guide": np.array([[b'["red"]']], dtype=object)})
    assert vllm[C.pre_output("guided_decoding_guide")].item() == b'["red"]'


def test_a_cpp_engine_that_does_not_stream_refuses_several_sequences(tok) -> None:  # type: ignore[no-untyped-def]
    from tritonforge.triton_models.errors import RequestError

    pre = Preprocessor(PreprocessSettings(model="x", engine=C.EngineKind.TRTLLM_CPP, engine_decoupled=False), tok)
    inputs = {"text_input": np.array([[b"hi"]], dtype=object),
              "num_return_sequences": np.array([[2]], dtype=np.int32)}
    with pytest.raises(RequestError, match="num_return_sequences must be 1") as err:
        pre.process(inputs)
    assert err.value.param == "num_return_sequences"
    with pytest.raises(RequestError, match="top_logprobs is not supported") as err:
        pre.process({"text_input": np.array([[b"hi"]], dtype=object),
                     "return_log_probs": np.array([[True]]), "top_logprobs": np.array([[2]], dtype=np.int32)})
    assert err.value.param == "top_logprobs"


# ---------------------------------------------------------------------- the LLM-API adapter
@pytest.fixture()
def standin(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(STANDINS))
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        monkeypatch.delitem(sys.modules, name)
    import tensorrt_llm

    assert tensorrt_llm.STANDIN
    return tensorrt_llm


def test_llmapi_sampling_greedy_is_top_k_1(standin, tok) -> None:  # type: ignore[no-untyped-def]
    from tritonforge.triton_models.engine.trtllm_llmapi import LlmApiAdapter

    a = LlmApiAdapter({"model": "m"})
    a.tokenizer = tok
    req = EngineRequest(input_ids=[1, 2], max_tokens=5, end_id=2,
                        sampling={"temperature": 0.0, "runtime_top_p": 1.0, "runtime_top_k": 0,
                                  "seed": 3, "min_p": 0.0, "pad_id": 2, "len_penalty": 1.0,
                                  "beam_width": 1})
    sp = a.sampling_params(req)
    assert (sp.top_k, sp.top_p, sp.temperature, sp.max_tokens, sp.end_id, sp.seed) == (1, None, None, 5, 2, 3)
    req.sampling.update(temperature=0.7, runtime_top_k=0, runtime_top_p=0.9)
    sp = a.sampling_params(req)
    assert (sp.top_k, sp.top_p, sp.temperature) == (None, 0.9, 0.7)
    assert sp.detokenize is False and sp.exclude_input_from_output is True


# ---------------------------------------------------------------------- C++ LoRA weights
def _converted(folder: Path, rows: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """An adapter as TensorRT-LLM's hf_lora_convert.py saves it: [1, rows, width] FP16 weights
    and [1, rows, 3] INT32 (module id, layer, rank)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    w = rng.standard_normal((1, rows, width)).astype(np.float16)
    c = np.array([[[i % 8, i // 8, 8] for i in range(rows)]], dtype=np.int32)
    np.save(folder / C.LORA_WEIGHTS_FILE, w)
    np.save(folder / C.LORA_CONFIG_FILE, c)
    return w, c


def test_lora_weights_go_with_an_adapters_first_request_only(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sql = _converted(tmp_path / "sql", 4, 16, 1)
    chat = _converted(tmp_path / "chat", 6, 16, 2)
    pre = Preprocessor(PreprocessSettings(
        model="x", engine=C.EngineKind.TRTLLM_CPP, lora_adapters={"chat": 1, "sql": 2},
        lora_paths={1: str(tmp_path / "chat"), 2: str(tmp_path / "sql")}), tok)

    def send(name: str | None) -> dict[str, np.ndarray]:
        inputs = {"text_input": np.array([[b"Hello"]], dtype=object), "max_tokens": np.array([[4]], dtype=np.int32)}
        if name:
            inputs["lora_name"] = np.array([[name.encode()]], dtype=object)
        return pre.process(inputs)

    w, cfg = C.pre_output("lora_weights"), C.pre_output("lora_config")
    first = send("sql")
    assert first[C.pre_output("lora_task_id")].item() == 2
    assert np.array_equal(first[w], sql[0]) and first[w].dtype == np.float16
    assert np.array_equal(first[cfg], sql[1]) and first[cfg].dtype == np.int32
    again = send("sql")
    assert again[C.pre_output("lora_task_id")].item() == 2 and w not in again and cfg not in again
    other = send("chat")
    assert np.array_equal(other[w], chat[0]) and other[cfg].shape == (1, 6, 3)
    plain = send(None)
    assert plain[C.pre_output("lora_task_id")].item() == 0 and w not in plain


def test_an_unconverted_adapter_folder_is_refused_at_start(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "peft").mkdir()
    (tmp_path / "peft" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"peft: needs model\.lora_weights\.npy and model\.lora_config\.npy"):
        Preprocessor(PreprocessSettings(model="x", engine=C.EngineKind.TRTLLM_CPP, lora_adapters={"p": 1},
                                        lora_paths={1: str(tmp_path / "peft")}), tok)
    _converted(tmp_path / "fp32", 2, 8, 3)
    np.save(tmp_path / "fp32" / C.LORA_WEIGHTS_FILE, np.zeros((1, 2, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="--storage-type float16"):
        Preprocessor(PreprocessSettings(model="x", engine=C.EngineKind.TRTLLM_CPP, lora_adapters={"p": 1},
                                        lora_paths={1: str(tmp_path / "fp32")}), tok)


def test_llmapi_sampling_asks_for_n_logprobs_and_the_guide(standin, tok) -> None:  # type: ignore[no-untyped-def]
    from tritonforge.triton_models.engine.trtllm_llmapi import LlmApiAdapter

    a = LlmApiAdapter({"model": "m"})
    a.tokenizer = tok
    req = EngineRequest(input_ids=[1, 2], max_tokens=5, n=3, return_log_probs=True, top_logprobs=2,
                        guide_type="ebnf_grammar", guide='root ::= "a"')
    sp = a.sampling_params(req)
    assert (sp.n, sp.logprobs) == (3, 2)
    assert sp.guided_decoding == standin.GuidedDecodingParams(grammar='root ::= "a"')
    for guide_type, guide, want in (("json", "", {"json_object": True}), ("regex", "[0-9]", {"regex": "[0-9]"}),
                                    ("json_schema", "{}", {"json": "{}"})):
        req.guide_type, req.guide = guide_type, guide
        assert a.sampling_params(req).guided_decoding == standin.GuidedDecodingParams(**want)
    req.guide_type = "choice"  # preprocessing lowers it; the adapter refuses rather than drops it
    with pytest.raises(Exception, match="guided_decoding_guide_type 'choice'"):
        a.sampling_params(req)
    plain = a.sampling_params(EngineRequest(input_ids=[1], max_tokens=2))
    assert (plain.n, plain.logprobs, plain.guided_decoding) == (1, None, None)


def test_llmapi_sequences_stream_one_step_each(standin, tok) -> None:  # type: ignore[no-untyped-def]
    """The LLM API's result updates one sequence per step and names finish reasons only when
    the whole request is done (TensorRT-LLM's executor/result.py): the adapter follows each
    sequence by its own count, ends one at end_id or max_tokens as soon as it sees it, and
    turns {token: Logprob} entries into the token's log-probability and its alternatives."""
    import asyncio

    from tensorrt_llm import RequestOutput
    from tensorrt_llm.executor.result import Logprob
    from tritonforge.triton_models.engine.trtllm_llmapi import LlmApiAdapter

    eos = tok.eos_token_id
    steps = [(0, [5], None), (1, [7], None), (1, [eos], "stop"), (0, [6], None),
             (0, [8], "length")]

    class _LLM:
        def generate_async(self, inputs, sampling_params, lora_request, streaming):  # type: ignore[no-untyped-def]
            result = RequestOutput(1, inputs["prompt_token_ids"], None, sampling_params.n)
            for index, ids, finish in steps:
                lps = [{t: Logprob(-0.5, 1), t + 100: Logprob(-1.5, 2)} for t in ids]
                result._queue.put_nowait((index, ids, lps, finish))
            return result

    a = LlmApiAdapter({"model": "m"})
    a.tokenizer, a.llm = tok, _LLM()
    req = EngineRequest(input_ids=[1, 2], max_tokens=3, n=2, end_id=eos, return_log_probs=True, top_logprobs=2)

    async def run() -> list:  # type: ignore[type-arg]
        return [d async for d in a.generate(req, "r")]

    deltas = [(d.index, d.token_ids, d.finish, d.logprobs, d.top) for d in asyncio.run(run())]
    assert deltas == [
        (0, [5], None, [-0.5], [[(5, -0.5), (105, -1.5)]]),
        (1, [7], None, [-0.5], [[(7, -0.5), (107, -1.5)]]),
        (1, [eos], "stop", [-0.5], [[(eos, -0.5), (eos + 100, -1.5)]]),  # ended here, not at the end
        (0, [6], None, [-0.5], [[(6, -0.5), (106, -1.5)]]),
        (0, [8], "length", [-0.5], [[(8, -0.5), (108, -1.5)]]),
    ]
