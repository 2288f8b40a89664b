"""tritonforge: serve LLMs on NVIDIA Triton Inference Server, boringly reliably.

One import namespace over several source folders, one per layer: ``generators/``
(contract, spec, rendering), ``triton_models/`` (what runs inside tritonserver),
``runtime/`` (launching the server, preparing models), ``gateway/``, ``cli/``,
``clients/`` and ``loadtests/``. In a wheel they are merged; in an editable install
``extend_path`` joins them.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
