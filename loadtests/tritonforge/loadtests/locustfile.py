"""Locust entry point for tritonforge load tests.

    locust -f loadtests/tritonforge/loadtests/locustfile.py --headless -u 8 -r 2 -t 60s \
        --protocol grpc --model smollm2 --triton-grpc 127.0.0.1:8001 \
        --csv results/locust --html results/report.html

See docs/loadtest.md for every option, the shapes, the SLO gates and distributed runs.
"""

from locust import events
from tritonforge.loadtests.session import wire
from tritonforge.loadtests.shapes import TritonForgeShape
from tritonforge.loadtests.users import GrpcStreamUser, HttpGenerateUser, HttpStreamUser

__all__ = ["GrpcStreamUser", "HttpGenerateUser", "HttpStreamUser", "TritonForgeShape"]

wire(events)
