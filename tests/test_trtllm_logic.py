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
