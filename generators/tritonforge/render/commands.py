"""TensorRT-LLM engine build and server launch commands for a spec.

They cannot run on a machine without a GPU, so they are built here as data (tested for
their construction) and laid out by the ``build_engine.sh`` / ``launch.sh`` templates.
A command is a list of lines; a line is a list of :class:`Word`. A word is either trusted
literal shell text written by tritonforge (``raw``) or a value the template shell-quotes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tritonforge.contract import MODEL_TENSORRT_LLM
from tritonforge.render.trtllm_params import (
    XGRAMMAR_TOKENIZER_INFO_FILE,
    XGRAMMAR_TOKENIZER_INFO_SCRIPT,
)
from tritonforge.spec.model import Spec

__all__ = [
    "GRPC_PORT",
    "HTTP_PORT",
    "METRICS_PORT",
    "QFORMAT",
    "Command",
    "Line",
    "Word",
    "argv",
    "build_commands",
    "checkpoint_dir",
    "launch_commands",
    "slurm_launch_commands",
    "summary",
    "tokenizer_info_path",
    "world_size",
]

HTTP_PORT: Final = 8000
GRPC_PORT: Final = 8001
METRICS_PORT: Final = 8002
RESPONSE_CACHE_BYTES: Final = 256 * 1024 * 1024

# spec.quantization -> TensorRT-LLM quantize.py --qformat
QFORMAT: Final[dict[str, str]] = {
    "none": "full_prec", "fp8": "fp8", "int8": "int8_wo", "int4_awq": "int4_awq",
}
_SPEC_MODE: Final = {"medusa": "medusa", "eagle": "eagle", "lookahead": "lookahead_decoding"}


@dataclass(frozen=True)
class Word:
    text: str
    raw: bool = False


Line = list[Word]
Command = list[Line]


def _opt(name: str, value: object | None = None) -> Line:
    return [Word(name)] + ([] if value is None else [Word(str(value))])


def _raw(*values: str) -> Line:
    return [Word(v, raw=True) for v in values]


def argv(command: Command) -> list[str]:
    """The command's words as the shell would pass them (raw words unquoted as written)."""
    return [w.text for line in command for w in line]


def world_size(spec: Spec) -> int:
    return spec.parallelism.tensor_parallel_size * spec.parallelism.pipeline_parallel_size


def summary(spec: Spec) -> str:
    p = spec.parallelism
    runtime = ("TensorRT-LLM LLM API, " if spec.backend == "tensorrtllm"
               and spec.tensorrtllm.runtime == "llmapi" else "")
    return (f"{runtime}quantization {spec.quantization}, tensor parallel {p.tensor_parallel_size}, "
            f"pipeline parallel {p.pipeline_parallel_size}")


def _llmapi(spec: Spec) -> bool:
    return spec.backend == "tensorrtllm" and spec.tensorrtllm.runtime == "llmapi"


def checkpoint_dir(spec: Spec) -> str:
    t = spec.tensorrtllm
    if t.checkpoint_dir is not None:
        return t.checkpoint_dir
    assert t.engine_dir is not None
    return t.engine_dir.rstrip("/") + "-checkpoint"


def tokenizer_info_path(spec: Spec) -> str:
    """Where ``build_engine.sh`` writes xgrammar's tokenizer info (in the engine folder), the
    file the backend's ``xgrammar_tokenizer_info_path`` names."""
    assert spec.tensorrtllm.engine_dir is not None
    return spec.tensorrtllm.engine_dir.rstrip("/") + "/" + XGRAMMAR_TOKENIZER_INFO_FILE


def build_commands(spec: Spec) -> list[Command]:
    """Checkpoint conversion/quantization, then ``trtllm-build``, then the tokenizer info the
    backend's guided decoding (xgrammar) reads, written by TensorRT-LLM's own script into the
    engine folder (:func:`tokenizer_info_path`)."""
    t, p, kv, bt = spec.tensorrtllm, spec.parallelism, spec.kv_cache, spec.batching
    assert t.engine_dir is not None
    ckpt = checkpoint_dir(spec)
    sp = spec.speculative
    convert: Command
    if sp.method in ("medusa", "eagle"):
        assert sp.draft_model is not None
        convert = [_raw("python3", f'"$TRTLLM_EXAMPLES/{sp.method}/convert_checkpoint.py"'),
                   _opt("--model_dir", spec.model.path),
                   _opt(f"--{sp.method}_model_dir", sp.draft_model),
                   _opt("--output_dir", ckpt),
                   _opt("--dtype", "float16" if spec.model.dtype == "auto" else spec.model.dtype),
                   _opt("--tp_size", p.tensor_parallel_size),
                   _opt("--pp_size", p.pipeline_parallel_size)]
        if sp.method == "medusa":
            convert.append(_opt("--num_medusa_heads", sp.num_speculative_tokens))
    else:
        convert = [_raw("python3", '"$TRTLLM_EXAMPLES/quantization/quantize.py"'),
                   _opt("--model_dir", spec.model.path),
                   _opt("--dtype", spec.model.dtype),
                   _opt("--qformat", QFORMAT[spec.quantization]),
                   _opt("--output_dir", ckpt),
                   _opt("--tp_size", p.tensor_parallel_size),
                   _opt("--pp_size", p.pipeline_parallel_size)]
        if kv.dtype != "auto":
            convert.append(_opt("--kv_cache_dtype", kv.dtype))
    build: Command = [
        _raw("trtllm-build"),
        _opt("--checkpoint_dir", ckpt),
        _opt("--output_dir", t.engine_dir),
        _opt("--gemm_plugin", "auto"),
        _opt("--max_batch_size", bt.max_batch_size),
        _opt("--max_input_len", spec.model.max_model_len),
        _opt("--max_seq_len", spec.model.max_model_len),
        _opt("--max_beam_width", t.max_beam_width),
    ]
    if bt.max_num_batched_tokens is not None:
        build.append(_opt("--max_num_tokens", bt.max_num_batched_tokens))
    if bt.chunked_prefill or kv.prefix_caching:
        build.append(_opt("--use_paged_context_fmha", "enable"))
    if spec.lora.enabled:
        build.append(_opt("--lora_plugin", "auto"))
        build.append(_opt("--max_lora_rank", spec.lora.max_rank))
        if spec.lora.adapters:
            build.append([Word("--lora_dir")] + [Word(spec.lora.adapters[n])
                                                 for n in sorted(spec.lora.adapters)])
    if sp.method != "none":
        build.append(_opt("--speculative_decoding_mode", _SPEC_MODE[sp.method]))
        build.append(_opt("--max_draft_len", sp.num_speculative_tokens))
    tokenizer_info: Command = [
        _raw("python3", f'"$TRTLLM_EXAMPLES/{XGRAMMAR_TOKENIZER_INFO_SCRIPT}"'),
        _opt("--model_dir", spec.model.tokenizer or spec.model.path),
        _opt("--output_dir", t.engine_dir),
    ]
    return [convert, build, tokenizer_info]


def _server_lines(spec: Spec, rank: int) -> Command:
    lines: Command = [
        _raw('--model-repository="$REPO"'),
        _opt("--disable-auto-complete-config"),
        _opt(f"--backend-config=python,shm-region-prefix-name=rank{rank}_"),
    ]
    if rank == 0:
        lines += [_opt(f"--http-port={HTTP_PORT}"), _opt(f"--grpc-port={GRPC_PORT}"),
                  _opt(f"--metrics-port={METRICS_PORT}")]
        if spec.response_cache:
            lines.append(_opt(f"--cache-config=local,size={RESPONSE_CACHE_BYTES}"))
        lines.append(_raw('"$@"'))
    else:
        lines += [_opt("--model-control-mode=explicit"),
                  _opt(f"--load-model={MODEL_TENSORRT_LLM}"),
                  _opt("--allow-http=false"), _opt("--allow-grpc=false"),
                  _opt("--allow-metrics=false")]
    return lines


# trtllm-llmapi-launch (TensorRT-LLM's launcher for the LLM API under MPI) runs the given
# command on rank 0 and TensorRT-LLM's worker on every other rank; the LLM in rank 0's
# tritonserver then drives those ranks.
_LLMAPI_LAUNCH: Final = "trtllm-llmapi-launch"


def launch_commands(spec: Spec) -> list[Command]:
    """C++ runtime: ``tritonserver`` for one rank, or ``mpirun`` with one tritonserver per
    rank. LLM API: ``tritonserver`` on one GPU; for TP x PP on one host, ``mpirun`` with one
    process per rank under ``trtllm-llmapi-launch`` (rank 0 runs tritonserver)."""
    world = world_size(spec)
    if _llmapi(spec):
        if world == 1:
            return [[_raw("exec", "tritonserver")] + _server_lines(spec, 0)]
        return [[_raw("exec", "mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(world),
                      _LLMAPI_LAUNCH, "tritonserver")] + _server_lines(spec, 0)]
    if world == 1:
        return [[_raw("exec", "tritonserver")] + _server_lines(spec, 0)]
    cmd: Command = [_raw("exec", "mpirun", "--allow-run-as-root")]
    for rank in range(world):
        cmd.append(_raw(*((":",) if rank else ()), "-n", "1", "tritonserver"))
        cmd += _server_lines(spec, rank)
    return [cmd]


def slurm_launch_commands(spec: Spec) -> list[Command]:
    """LLM API across nodes: ``srun`` starts one task per rank (``$GPUS_PER_NODE`` per node,
    8 unless set) under ``trtllm-llmapi-launch``; run it inside a Slurm allocation."""
    world = world_size(spec)
    return [[_raw("exec", "srun", "--mpi=pmix", f"--ntasks={world}",
                  '--ntasks-per-node="$GPUS_PER_NODE"', _LLMAPI_LAUNCH, "tritonserver")]
            + _server_lines(spec, 0)]
