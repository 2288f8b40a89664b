"""The deployment spec: one typed YAML document that describes a whole Triton LLM deployment.

``load_spec(path)`` reads, normalises and validates a spec; every problem raises
``SpecError`` whose message names the field path, what is allowed, the value received and
the fix. Nothing here imports an inference engine.
"""

from tritonforge.spec.errors import SpecError
from tritonforge.spec.load import load_spec, parse_spec
from tritonforge.spec.model import (
    Backend,
    Batching,
    BatchingStrategy,
    Device,
    EngineModel,
    Instances,
    KvCache,
    Limits,
    Lora,
    ModelSection,
    Parallelism,
    Quantization,
    SamplingSection,
    SchedulerPolicy,
    Spec,
    Speculative,
    SpeculativeMethod,
    TensorRTLLMSection,
    VllmSection,
)

__all__ = [
    "Backend",
    "Batching",
    "BatchingStrategy",
    "Device",
    "EngineModel",
    "Instances",
    "KvCache",
    "Limits",
    "Lora",
    "ModelSection",
    "Parallelism",
    "Quantization",
    "SamplingSection",
    "SchedulerPolicy",
    "Spec",
    "SpecError",
    "Speculative",
    "SpeculativeMethod",
    "TensorRTLLMSection",
    "VllmSection",
    "load_spec",
    "parse_spec",
]
