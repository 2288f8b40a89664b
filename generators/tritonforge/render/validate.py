"""Validate a Triton model repository (generated or not) before any server sees it.

``validate_repository(path)`` returns a list of :class:`Problem`; each names the file, the
model, the tensor or field, and the fix. Checks:

* every ``config.pbtxt`` parses into Triton's ``ModelConfig`` (``model_config_pb2``) and its
  ``name`` matches its folder; no file holds a leftover ``${...}``/``{{...}}``/``{%``;
* every ensemble step maps only tensors its composing model declares, with the same dtype
  and compatible dims; required inputs are mapped; each ensemble output is produced exactly
  once; each ensemble input is consumed; no tensor is produced twice; no cycles;
* ``max_batch_size`` of an ensemble is <= that of every composing model;
* streaming wiring: a composing model's ``streaming`` input is mapped iff that model is
  decoupled (so a decoupled engine makes the ensemble streamable and a non-decoupled engine
  can never be asked to stream); with a decoupled model in the chain, ``postprocessing`` has
  one instance; response-cached models and the ``*_sync`` model are never decoupled;
* a ``tensorrtllm`` model agrees with the backend's facts table (``render.trtllm_params``,
  from upstream's template): every parameter key is one the backend reads, ``gpt_model_path``
  is set, every input/output is one upstream declares with its dtype, dims, optional flag and
  scalar reshape; when the engine folder exists its ``config.json`` agrees on batch size and
  lengths; the LLM-API engine model has a ``1/model.yaml`` mapping of ``LLM()`` arguments;
* JSON-valued parameters and ``model.json``/``multi_lora.json`` parse.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tritonforge import contract as C
from tritonforge.render.escape import MARKER_RE
from tritonforge.render.trtllm_params import (
    BATCHING_STRATEGIES,
    DECODING_MODES,
    GUIDED_DECODING_BACKENDS,
    TRTLLM_ALWAYS_READ,
    TRTLLM_INPUTS,
    TRTLLM_OUTPUTS,
    TRTLLM_PARAMETERS,
    TRTLLM_PLACEHOLDERS,
    TRTLLM_SOURCE,
)

__all__ = ["IGNORED_PARTS", "Problem", "read_tree", "validate_files", "validate_repository"]

IGNORED_PARTS: Final = frozenset({"__pycache__"})
_JSON_PARAMS: Final[dict[str, type]] = {
    C.Param.SAMPLING_DEFAULTS.value: dict,
    C.Param.LORA_ADAPTERS.value: dict,
    C.Param.ENGINE_ARGS.value: dict,
    C.Param.ENGINE_ENV.value: dict,
}


@dataclass(frozen=True)
class Problem:
    file: str
    model: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}" + (f" (model {self.model})" if self.model else "")
        return f"{where}: {self.message}"


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` as ``{posix relative path: bytes}``, skipping caches."""
    out: dict[str, bytes] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in IGNORED_PARTS for part in rel.parts) or p.suffix == ".pyc":
            continue
        if p.is_file():
            out[rel.as_posix()] = p.read_bytes()
    return out


def _dtype_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2 as mc  # type: ignore[import-untyped]

    return str(mc.DataType.Name(value))


def _dims_compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _params(cfg: Any) -> dict[str, str]:
    return {k: v.string_value for k, v in cfg.parameters.items()}


class _Checker:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.problems: list[Problem] = []
        self.configs: dict[str, Any] = {}
        self.config_file: dict[str, str] = {}

    def add(self, file: str, model: str, message: str) -> None:
        self.problems.append(Problem(file, model, message))

    # -- files ---------------------------------------------------------------------------
    def check_markers(self) -> None:
        for path, data in self.files.items():
            text = data.decode("utf-8", errors="replace")
            for lineno, line in enumerate(text.splitlines(), start=1):
                m = MARKER_RE.search(line)
                if m:
                    self.add(path, path.split("/")[0] if "/" in path else "",
                             f"line {lineno}: leftover template placeholder {m.group(0)!r} in "
                             f"{line.strip()[:80]!r}. Fix: generate the file from a spec "
                             "instead of filling templates")

    def parse_configs(self) -> None:
        from google.protobuf import text_format  # type: ignore[import-untyped]
        from tritonclient.grpc import model_config_pb2 as mc

        dirs = sorted({p.split("/")[0] for p in self.files if "/" in p})
        for d in dirs:
            if d.startswith("."):
                continue
            path = f"{d}/config.pbtxt"
            if path not in self.files:
                self.add(f"{d}/", d, "model folder has no config.pbtxt. Fix: regenerate, or "
                         "remove the folder")
                continue
            cfg = mc.ModelConfig()
            try:
                text_format.Parse(self.files[path].decode("utf-8"), cfg)
            except (text_format.ParseError, UnicodeDecodeError) as exc:
                self.add(path, d, f"does not parse as Triton ModelConfig: {exc}. Fix: "
                         "regenerate it from the spec")
                continue
            if cfg.name and cfg.name != d:
                self.add(path, d, f"name {cfg.name!r} differs from its folder {d!r}. Fix: "
                         "make them equal")
            if not any(p.startswith(f"{d}/") and p.split("/")[1].isdigit()
                       for p in self.files if p.count("/") >= 2):
                self.add(f"{d}/", d, "has no version folder (e.g. 1/). Fix: regenerate")
            self.configs[d] = cfg
            self.config_file[d] = path

    # -- per model -----------------------------------------------------------------------
    def check_models(self) -> None:
        for name, cfg in self.configs.items():
            path = self.config_file[name]
            params = _params(cfg)
            for key, kind in _JSON_PARAMS.items():
                if key in params:
                    try:
                        value = json.loads(params[key])
                    except json.JSONDecodeError as exc:
                        self.add(path, name, f"parameter {key} is not valid JSON ({exc}). "
                                 "Fix: regenerate")
                        continue
                    if not isinstance(value, kind):
                        self.add(path, name, f"parameter {key} must be a JSON "
                                 f"{kind.__name__}. Fix: regenerate")
            if cfg.backend == "python":
                if f"{name}/1/model.py" not in self.files:
                    self.add(f"{name}/1/model.py", name, "python model has no 1/model.py. Fix: "
                             "regenerate")
                for ref in (C.Param.TARGET_MODEL, C.Param.ENGINE_MODEL):
                    target = params.get(ref.value)
                    if target is not None and target not in self.configs:
                        self.add(path, name, f"parameter {ref.value} names model "
                                 f"{target!r}, which is not in the repository. Fix: regenerate")
                src = self.files.get(f"{name}/1/model.py", b"").decode("utf-8", "replace")
                if "tritonforge.triton_models.sync_model" in src and \
                        cfg.model_transaction_policy.decoupled:
                    self.add(path, name, "the non-streaming (*_sync) model is decoupled; it must "
                             "answer with exactly one response. Fix: decoupled: false")
            if cfg.response_cache.enable and cfg.model_transaction_policy.decoupled:
                self.add(path, name, "response_cache is enabled on a decoupled model; Triton "
                         "cannot cache streamed responses. Fix: disable one of them")
            if cfg.backend == "tensorrtllm":
                self.check_trtllm(name, cfg, path, params)
            if params.get(C.Param.ENGINE_KIND.value) == C.EngineKind.TRTLLM_LLMAPI.value and \
                    cfg.backend == "python" and name != C.MODEL_PREPROCESSING and \
                    C.Param.LORA_ADAPTERS.value in params and C.Param.ENGINE_ENV.value in params:
                self.check_llmapi(name, path)
            if cfg.backend == "vllm":
                for rel in ("1/model.json", "1/multi_lora.json"):
                    f = f"{name}/{rel}"
                    if f in self.files:
                        try:
                            json.loads(self.files[f])
                        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                            self.add(f, name, f"is not valid JSON ({exc}). Fix: regenerate")
                    elif rel == "1/model.json":
                        self.add(f, name, "the vLLM backend needs 1/model.json. Fix: regenerate")

    def check_llmapi(self, name: str, path: str) -> None:
        """The LLM-API engine model reads its ``LLM()`` arguments from ``1/model.yaml``."""
        import yaml

        rel = f"{name}/1/model.yaml"
        if rel not in self.files:
            self.add(rel, name, "the LLM-API engine model needs 1/model.yaml (its "
                     "tensorrt_llm.LLM() arguments). Fix: regenerate")
            return
        try:
            args = yaml.safe_load(self.files[rel])
        except yaml.YAMLError as exc:
            self.add(rel, name, f"is not valid YAML ({exc}). Fix: regenerate")
            return
        if not isinstance(args, dict) or not isinstance(args.get("model"), str):
            self.add(rel, name, "must be a mapping of LLM() arguments with a 'model'. Fix: "
                     "regenerate")
        elif args.get("backend") != "pytorch":
            self.add(rel, name, f"backend must be 'pytorch' (TensorRT-LLM's LLM API on the "
                     f"PyTorch backend); got {args.get('backend')!r}. Fix: regenerate")

    def check_trtllm_tensors(self, name: str, cfg: Any, path: str) -> None:
        """Each declared tensor against upstream's declaration of it (the facts table)."""
        for section, tensors, facts in (("input", cfg.input, TRTLLM_INPUTS),
                                        ("output", cfg.output, TRTLLM_OUTPUTS)):
            for t in tensors:
                f = facts.get(t.name)
                if f is None:
                    self.add(path, name, f"{section} {t.name!r} is not a tensor of the "
                             f"TensorRT-LLM backend ({TRTLLM_SOURCE}). Fix: remove it or use "
                             "the backend's name")
                    continue
                dtype = _dtype_name(t.data_type)
                if f.dtype is not None and dtype != f.dtype:
                    self.add(path, name, f"{section} {t.name!r} is {dtype}; the backend "
                             f"declares {f.dtype}. Fix: regenerate")
                if tuple(t.dims) != f.dims:
                    self.add(path, name, f"{section} {t.name!r} has dims {list(t.dims)}; the "
                             f"backend declares {list(f.dims)}. Fix: regenerate")
                if section == "input":
                    if bool(t.optional) != f.optional:
                        self.add(path, name, f"input {t.name!r} has optional: "
                                 f"{str(bool(t.optional)).lower()}; the backend declares "
                                 f"{str(f.optional).lower()}. Fix: regenerate")
                    scalar = t.HasField("reshape") and len(t.reshape.shape) == 0
                    if scalar != f.scalar:
                        self.add(path, name, f"input {t.name!r} "
                                 + ("lacks" if f.scalar else "has")
                                 + " the backend's scalar reshape (reshape: { shape: [ ] }). "
                                 "Fix: regenerate")

    def check_trtllm(self, name: str, cfg: Any, path: str, params: dict[str, str]) -> None:
        self.check_trtllm_tensors(name, cfg, path)
        for key in sorted(params):
            if key in TRTLLM_PLACEHOLDERS:
                self.add(path, name, f"parameter {key!r} is the name of a placeholder in "
                         f"NVIDIA's template, not a key the backend reads; the key is "
                         f"{TRTLLM_PLACEHOLDERS[key]!r}. Fix: rename it")
            elif key not in TRTLLM_PARAMETERS:
                self.add(path, name, f"parameter {key!r} is not a documented TensorRT-LLM "
                         "backend parameter (the backend would ignore it silently). Fix: check "
                         "the spelling against the backend documentation")
            elif params[key].startswith("${"):
                self.add(path, name, f"parameter {key!r} is an unfilled placeholder "
                         f"{params[key]!r}. Fix: set a value in the spec")
        for key in ("gpt_model_type", "batching_strategy"):
            if key in params and params[key] not in BATCHING_STRATEGIES:
                self.add(path, name, f"parameter {key} must be one of "
                         f"{', '.join(BATCHING_STRATEGIES)}; got {params[key]!r}")
        for key in TRTLLM_ALWAYS_READ:
            if key not in params:
                self.add(path, name, f"parameter {key} is missing: the backend reads it with no "
                         "default and does not load without it (an empty value turns guided "
                         "decoding off). Fix: regenerate")
        backend = params.get("guided_decoding_backend", "")
        if backend and not backend.startswith("${") and backend not in GUIDED_DECODING_BACKENDS:
            self.add(path, name, f"parameter guided_decoding_backend must be one of "
                     f"{', '.join(GUIDED_DECODING_BACKENDS)} or empty; got {backend!r}")
        if "decoding_mode" in params and params["decoding_mode"] not in DECODING_MODES:
            self.add(path, name, f"parameter decoding_mode must be one of "
                     f"{', '.join(DECODING_MODES)}; got {params['decoding_mode']!r}")
        if "gpt_model_path" not in params:
            self.add(path, name, "parameter gpt_model_path (the engine folder) is missing: the "
                     "backend cannot load. Fix: set tensorrtllm.engine_dir in the spec")
            return
        engine_cfg = Path(params["gpt_model_path"]) / "config.json"
        if not engine_cfg.is_file():
            return
        try:
            data = json.loads(engine_cfg.read_text("utf-8"))
            build = data.get("build_config", data)
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            self.add(str(engine_cfg), name, f"engine config.json is unreadable ({exc})")
            return

        def num(key: str) -> int | None:
            v = build.get(key)
            return v if isinstance(v, int) else None

        mbs = num("max_batch_size")
        if mbs is not None and cfg.max_batch_size > mbs:
            self.add(path, name, f"max_batch_size {cfg.max_batch_size} exceeds the engine's "
                     f"max_batch_size {mbs} ({engine_cfg}). Fix: set batching.max_batch_size "
                     f"<= {mbs} or rebuild the engine")
        beam = num("max_beam_width")
        if beam is not None and int(params.get("max_beam_width", "1") or 1) > beam:
            self.add(path, name, f"max_beam_width {params.get('max_beam_width')} exceeds the "
                     f"engine's {beam}. Fix: lower tensorrtllm.max_beam_width or rebuild")
        pre = self.configs.get(C.MODEL_PREPROCESSING)
        model_len = _params(pre).get(C.Param.MAX_MODEL_LEN.value) if pre is not None else None
        if model_len and model_len.isdigit():
            seq, inp = num("max_seq_len"), num("max_input_len")
            if seq is not None and int(model_len) > seq:
                self.add(path, name, f"model.max_model_len {model_len} exceeds the engine's "
                         f"max_seq_len {seq} ({engine_cfg}). Fix: lower model.max_model_len or "
                         "rebuild the engine")
            if inp is not None and inp < int(model_len) - 1:
                self.add(path, name, f"the engine's max_input_len {inp} is below "
                         f"model.max_model_len - 1 ({int(model_len) - 1}): longer prompts would "
                         "pass preprocessing and fail in the engine. Fix: lower "
                         "model.max_model_len or rebuild with a larger --max_input_len")

    # -- ensembles -----------------------------------------------------------------------
    def check_ensembles(self) -> None:
        for name, cfg in self.configs.items():
            if cfg.platform == "ensemble":
                self.check_ensemble(name, cfg, self.config_file[name])

    def check_ensemble(self, name: str, cfg: Any, path: str) -> None:
        add = self.add
        ens_in = {t.name: t for t in cfg.input}
        ens_out = {t.name: t for t in cfg.output}
        for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
            for tname, n in Counter(t.name for t in tensors).items():
                if n > 1:
                    add(path, name, f"ensemble {kind} {tname!r} is declared {n} times. Fix: "
                        "declare it once")
        steps = list(cfg.ensemble_scheduling.step)
        if not steps:
            add(path, name, "ensemble has no ensemble_scheduling steps. Fix: regenerate")
            return
        # tensor -> (step index, dtype, dims)
        produced: dict[str, list[tuple[int, int, list[int]]]] = {}
        step_cfgs: list[Any] = []
        for i, step in enumerate(steps):
            sub = self.configs.get(step.model_name)
            step_cfgs.append(sub)
            if sub is None:
                add(path, name, f"step {i} uses model {step.model_name!r}, which is not in the "
                    "repository. Fix: generate it or correct model_name")
                continue
            outs = {t.name: t for t in sub.output}
            for key, tensor in step.output_map.items():
                t = outs.get(key)
                if t is None:
                    add(path, name, f"step {i} ({step.model_name}): output_map key {key!r} is "
                        f"not an output of {step.model_name}; it declares "
                        f"{', '.join(sorted(outs))}. Fix: use one of those names")
                    continue
                produced.setdefault(tensor, []).append((i, t.data_type, list(t.dims)))
        for tensor, sources in sorted(produced.items()):
            if len(sources) > 1:
                add(path, name, f"tensor {tensor!r} is produced by {len(sources)} steps "
                    f"({', '.join(str(s[0]) for s in sources)}); each tensor must be produced "
                    "exactly once. Fix: map it from one step")
            if tensor in ens_in:
                add(path, name, f"tensor {tensor!r} is an ensemble input and also produced by "
                    f"step {sources[0][0]}. Fix: rename the internal tensor")
        consumed: set[str] = set()
        deps: dict[int, set[int]] = {i: set() for i in range(len(steps))}
        for i, step in enumerate(steps):
            sub = step_cfgs[i]
            if sub is None:
                continue
            ins = {t.name: t for t in sub.input}
            mapped = set()
            for key, tensor in step.input_map.items():
                consumed.add(tensor)
                mapped.add(key)
                t = ins.get(key)
                if t is None:
                    add(path, name, f"step {i} ({step.model_name}): input_map key {key!r} is "
                        f"not an input of {step.model_name}; it declares "
                        f"{', '.join(sorted(ins))}. Fix: use one of those names")
                    continue
                if tensor in ens_in:
                    src_dtype, src_dims = ens_in[tensor].data_type, list(ens_in[tensor].dims)
                    src = f"ensemble input {tensor!r}"
                elif tensor in produced:
                    j, src_dtype, src_dims = produced[tensor][0]
                    deps[i].add(j)
                    src = f"tensor {tensor!r} (from step {j})"
                else:
                    add(path, name, f"step {i} ({step.model_name}): input {key!r} reads tensor "
                        f"{tensor!r}, which no step produces and is not an ensemble input. "
                        "Fix: map it from a step's output_map or declare it as an input")
                    continue
                if src_dtype != t.data_type:
                    add(path, name, f"step {i} ({step.model_name}): input {key!r} is "
                        f"{_dtype_name(t.data_type)} but {src} is {_dtype_name(src_dtype)}. "
                        "Fix: make the dtypes equal")
                elif not _dims_compatible(src_dims, list(t.dims)):
                    add(path, name, f"step {i} ({step.model_name}): input {key!r} has dims "
                        f"{list(t.dims)} but {src} has {src_dims}. Fix: make them compatible")
            for t in sub.input:
                if not t.optional and t.name not in mapped:
                    add(path, name, f"step {i} ({step.model_name}): required input "
                        f"{t.name!r} is not mapped. Fix: add it to input_map")
            # streaming wiring
            decoupled = sub.model_transaction_policy.decoupled
            if "streaming" in ins:
                if decoupled and "streaming" not in mapped:
                    add(path, name, f"step {i} ({step.model_name}): the model is decoupled but "
                        "its 'streaming' input is not mapped, so the ensemble can never "
                        "stream. Fix: map 'streaming' (streaming: true) or make it "
                        "non-decoupled")
                if not decoupled and "streaming" in mapped:
                    add(path, name, f"step {i} ({step.model_name}): 'streaming' is mapped but "
                        "the model is not decoupled (\"Streaming is only supported in decoupled "
                        "mode\"). Fix: set decoupled: true (streaming: true) or unmap it")
            if cfg.max_batch_size > 0 and cfg.max_batch_size > sub.max_batch_size:
                add(path, name, f"step {i} ({step.model_name}): ensemble max_batch_size "
                    f"{cfg.max_batch_size} exceeds {step.model_name}'s {sub.max_batch_size}. "
                    "Fix: use one batching.max_batch_size for all models")
        for tensor, t in ens_out.items():
            sources = produced.get(tensor, [])
            if not sources:
                add(path, name, f"ensemble output {tensor!r} is produced by no step. Fix: map "
                    "it in a step's output_map")
            elif sources[0][1] != t.data_type:
                add(path, name, f"ensemble output {tensor!r} is declared "
                    f"{_dtype_name(t.data_type)} but step {sources[0][0]} produces "
                    f"{_dtype_name(sources[0][1])}. Fix: make the dtypes equal")
        for tensor in ens_in:
            if tensor not in consumed:
                add(path, name, f"ensemble input {tensor!r} is consumed by no step. Fix: map "
                    "it in a step's input_map or remove it")
        for tensor in produced:
            if tensor not in consumed and tensor not in ens_out:
                add(path, name, f"tensor {tensor!r} is produced but never used. Fix: remove it "
                    "from the output_map")
        # cycles (Kahn)
        indeg = {i: len(d) for i, d in deps.items()}
        ready = [i for i, n in indeg.items() if n == 0]
        seen = 0
        while ready:
            j = ready.pop()
            seen += 1
            for i, d in deps.items():
                if j in d:
                    indeg[i] -= 1
                    if indeg[i] == 0:
                        ready.append(i)
        if seen != len(deps):
            cyc = sorted(i for i, n in indeg.items() if n > 0)
            add(path, name, f"steps {cyc} form a cycle. Fix: a step may only read tensors of "
                "earlier steps")
        # Triton refuses a step, or the ensemble outputs, fed both by a decoupled model's
        # responses and by tensors from before it (they would pair up differently).
        behind: dict[str, bool] = {}  # tensor -> produced downstream of a decoupled model
        order = sorted(range(len(steps)), key=lambda i: len(deps[i]))
        for _ in range(len(steps)):
            for i in order:
                sub = step_cfgs[i]
                if sub is None:
                    continue
                tensors = list(steps[i].input_map.values())
                down = sub.model_transaction_policy.decoupled or any(
                    behind.get(t, False) for t in tensors)
                for t in steps[i].output_map.values():
                    behind[t] = down
        for i, step in enumerate(steps):
            tensors = list(step.input_map.values())
            if any(behind.get(t, False) for t in tensors) and not all(
                    behind.get(t, False) for t in tensors):
                mixed = sorted(t for t in tensors if not behind.get(t, False))
                add(path, name, f"step {i} ({step.model_name}) reads responses of a decoupled "
                    f"model together with tensors from before it ({', '.join(mixed)}); Triton "
                    "rejects such an ensemble. Fix: have the decoupled model pass these on as "
                    "outputs")
        outs_behind = {t: behind.get(t, False) for t in ens_out if t in produced}
        if any(outs_behind.values()) and not all(outs_behind.values()):
            mixed = sorted(t for t, b in outs_behind.items() if not b)
            add(path, name, f"ensemble outputs mix responses of a decoupled model with tensors "
                f"from before it ({', '.join(mixed)}); Triton rejects such an ensemble. Fix: "
                "produce every output after the decoupled model")
        subs = [s for s in step_cfgs if s is not None]
        if any(s.model_transaction_policy.decoupled for s in subs):
            if cfg.response_cache.enable:
                add(path, name, "response_cache is enabled on an ensemble with a decoupled "
                    "model. Fix: cache the *_sync model instead")
            post = self.configs.get(C.MODEL_POSTPROCESSING)
            if post is not None and post in subs:
                count = sum(g.count or 1 for g in post.instance_group) or 1
                if count > 1:
                    add(self.config_file[C.MODEL_POSTPROCESSING], C.MODEL_POSTPROCESSING,
                        f"instance count {count} with a decoupled (streaming) engine: each "
                        "stream's detokenizer state lives in one instance. Fix: count 1")


def validate_files(files: dict[str, bytes]) -> list[Problem]:
    """Validate an in-memory repository ``{relative path: bytes}``."""
    checker = _Checker(files)
    checker.check_markers()
    checker.parse_configs()
    checker.check_models()
    checker.check_ensembles()
    return checker.problems


def validate_repository(root: str | Path) -> list[Problem]:
    """Validate the repository folder ``root``."""
    root = Path(root)
    if not root.is_dir():
        return [Problem(str(root), "", "is not a folder. Fix: pass a model repository folder")]
    files = read_tree(root)
    problems = [Problem(f"{root}/{p.file}" if p.file else str(root), p.model, p.message)
                for p in validate_files(files)]
    if not any("/config.pbtxt" in p for p in files):
        problems.append(Problem(str(root), "", "contains no model (no */config.pbtxt). Fix: "
                                "generate a repository into it"))
    return problems
