"""tritonforge: serve LLMs on NVIDIA Triton Inference Server, boringly reliably.

The package is assembled from three source folders (``generators/``, ``clients/``,
``loadtests/``); in a wheel they are merged, in an editable install ``extend_path`` joins
them.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
