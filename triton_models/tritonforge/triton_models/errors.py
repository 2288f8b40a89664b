"""Errors the backend logic raises; the Triton adapters map them to Triton error codes."""

from __future__ import annotations

__all__ = ["RequestCancelled", "RequestError"]


class RequestError(ValueError):
    """A bad request: answered with Triton INVALID_ARG and this message; the server stays up."""


class RequestCancelled(Exception):
    """The client cancelled the request."""
