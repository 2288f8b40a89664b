"""Stand-in for ``tensorrt_llm.executor`` (see the package docstring): not TensorRT-LLM."""
