"""The spec schema: defaults, documentation, docs in sync, and a light import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel
from tritonforge.contract import REQUEST_PARAMETERS, SAMPLING_DEFAULTS
from tritonforge.spec import Spec, SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]


def _sections(model: type[BaseModel] = Spec) -> list[type[BaseModel]]:
    out = [model]
    for field in model.model_fields.values():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _sections(ann)
    return out


def test_every_field_is_documented_and_defaulted() -> None:
    for section in _sections():
        for name, field in section.model_fields.items():
            assert field.description, f"{section.__name__}.{name} has no docstring"
            if section is not Spec or name != "name":
                assert not field.is_required(), f"{section.__name__}.{name} has no default"


def test_minimal_spec_defaults() -> None:
    spec = parse_spec({"name": "m"})
    assert spec.backend == "vllm" and spec.streaming and spec.non_streaming_model
    assert spec.batching.max_batch_size == 64
    assert spec.defaults.max_tokens == SAMPLING_DEFAULTS["max_tokens"]
    assert spec.defaults.top_p == SAMPLING_DEFAULTS["top_p"]


def test_defaults_section_is_the_parameter_table() -> None:
    # one field per table row with a spec default, documented by the row's doc line
    fields = type(parse_spec({"name": "m"}).defaults).model_fields
    rows = {p.name: p for p in REQUEST_PARAMETERS if p.spec_default}
    assert set(fields) == set(rows)
    for name, row in rows.items():
        assert row.doc.split(";")[0] in (fields[name].description or "") or name == "stream"


@pytest.mark.parametrize("path", sorted((ROOT / "deployments").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_example_specs_load(path: Path) -> None:
    assert load_spec(path).name


def test_default_spec_values() -> None:
    spec = load_spec(ROOT / "deployments" / "default.yaml")
    assert spec.name == "smollm2" and spec.device == "cpu" and not spec.vllm.enforce_eager
    assert spec.model.max_model_len == 2048 and spec.batching.max_num_seqs == 128
    assert spec.batching.chunked_prefill and spec.kv_cache.prefix_caching
    assert spec.batching.stream_interval_ms == 250 and spec.batching.coalesce_from_streams == 4
    assert spec.kv_cache.cpu_space_gib == 1 and spec.defaults.max_tokens == 128


def test_spec_error_lists_problems() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"name": "a/b", "streaming": "no"})
    assert len(info.value.problems) == 2


def test_generator_does_not_import_engines() -> None:
    code = ("import sys, tritonforge.cli.generate, tritonforge.spec, tritonforge.render.renderer,"
            " tritonforge.render.validate, tritonforge.render.write;"
            " print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"
