"""Typed Triton clients."""
