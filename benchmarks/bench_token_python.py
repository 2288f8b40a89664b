"""CPU time of tritonforge's own Python per streamed token, outside Triton.

The Triton path at one stream spends ~3 ms of host CPU per output token beside vLLM's engine
(``bench_peer.py`` prints it), against ~1 ms for ``vllm serve``. This asks how much of that is
tritonforge's own logic, with no Triton in the loop: for each token of a 64-token stream it
runs what the two Python stubs run per streamed response --

* the engine model: ``engine_outputs`` (the response's tensors as numpy arrays);
* postprocessing: the state key, the paced cancel check's bookkeeping, ``Postprocessor.process``
  (incremental detokenization with the real tokenizer) and ``PostResult.arrays``

-- and prints the thread CPU time per token (median of ``--repeats``). What it leaves out is
what the Python backend does with those arrays (``pb_utils.Tensor``, the IPC to tritonserver),
which exists only inside a stub; ``bench_host_tax.py --burner floor`` measures that part with
no-op models.

    .venv/bin/python benchmarks/bench_token_python.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "triton_models"), str(ROOT / "generators"), str(ROOT / "runtime")]

from tritonforge.contract import POSTPROCESSING_SOURCES  # noqa: E402
from tritonforge.triton_models.detokenize import make_decoder  # noqa: E402
from tritonforge.triton_models.engine.request import engine_outputs  # noqa: E402
from tritonforge.triton_models.pacing import cancel_check_seconds  # noqa: E402
from tritonforge.triton_models.postprocess import Postprocessor  # noqa: E402

MODEL_REF = "package:smollm2-135m-instruct"  # the default spec's model
TEXT = ("Once upon a time, in a land far away, there lived a king who had three daughters, "
        "a dog called Brünhild and a castle with 1,024 windows. ")


def stream_once(post: Postprocessor, ids: list[int], key: int, n_input: int) -> int:
    """One request's stream, token by token, as the engine and postprocessing see it; the
    number of characters it produced (checked by the caller)."""
    chars = 0
    for i, tok in enumerate(ids):
        finish = "length" if i == len(ids) - 1 else ""
        out = engine_outputs([tok], finish, n_input, None, key)
        # What reaches postprocessing: each of its inputs from the engine output the ensemble
        # maps to it, without the batch dimension; None where the response leaves it out.
        inputs = {name: None if (arr := out.get(source)) is None else arr[0]
                  for name, (_, source) in POSTPROCESSING_SOURCES.items()}
        rid = "client-id"
        post.cancel_check_due(Postprocessor.state_id(inputs, rid), cancel_check_seconds(post.open_requests))
        result = post.process(inputs, rid)
        result.arrays()
        chars += len(result.text)
    return chars


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--requests", type=int, default=200, help="requests per repeat")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()

    from tritonforge.runtime.models import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL_REF))
    ids = tokenizer(TEXT * 8)["input_ids"][: a.tokens]
    if len(ids) < a.tokens:
        raise SystemExit(f"the text has only {len(ids)} tokens")
    expected = len(tokenizer.decode(ids, skip_special_tokens=True))
    post = Postprocessor(make_decoder(tokenizer), tokenizer.eos_token_id)
    per_token: list[float] = []
    for _ in range(a.repeats):
        t0 = time.thread_time()
        for r in range(a.requests):
            chars = stream_once(post, ids, 1000 + r, 40)
            if chars != expected:
                raise SystemExit(f"the stream produced {chars} characters, a full decode {expected}")
        per_token.append((time.thread_time() - t0) / (a.requests * len(ids)) * 1e6)
    if post.open_requests:
        raise SystemExit(f"{post.open_requests} requests left state behind")
    print(f"{a.tokens} tokens per request, {a.requests} requests per repeat, {a.repeats} repeats")
    print(f"tritonforge's Python per streamed token (engine_outputs + postprocessing): "
          f"{statistics.median(per_token):.1f} us CPU (median; {min(per_token):.1f}-{max(per_token):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
