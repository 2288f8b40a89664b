"""The errors the model logic raises; the Triton adapters answer them with their kind's code.

Each carries a :class:`~tritonforge.contract.ErrorKind` and, where a request parameter is at
fault, its name: ``triton_io.error_response`` writes both into the error's tag
(``contract.format_error``), which clients read back with ``contract.parse_error``.
"""

from __future__ import annotations

from tritonforge.contract import ErrorKind

__all__ = ["EngineFailure", "ModelError", "RequestError"]


class ModelError(Exception):
    """An error answered to one request; the model keeps serving."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str, *, param: str | None = None, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.param = param
        if kind is not None:
            self.kind = kind


class RequestError(ModelError):
    """A bad request: INVALID_ARG, naming the parameter at fault when there is one."""

    kind = ErrorKind.INVALID_REQUEST


class EngineFailure(ModelError):
    """The inference engine failed on a valid request."""

    kind = ErrorKind.ENGINE_FAILURE
