"""An OpenAI-compatible gateway over a tritonforge deployment on Triton.

::

    from tritonforge.gateway import run_gateway_in_thread

    gw = run_gateway_in_thread("127.0.0.1:8001", port=8080)     # Triton gRPC; model discovered
    # ... openai.OpenAI(base_url=gw.url, api_key="unused").chat.completions.create(...)
    gw.stop()

Or from the command line: ``tritonforge gateway --triton-url 127.0.0.1:8001 --port 8080``.
"""

from tritonforge.gateway.app import API_KEY_ENV, GatewayConfig, create_app
from tritonforge.gateway.runner import GatewayHandle, run_gateway, run_gateway_in_thread

__all__ = [
    "API_KEY_ENV",
    "GatewayConfig",
    "GatewayHandle",
    "create_app",
    "run_gateway",
    "run_gateway_in_thread",
]
