"""Rendering a spec into a Triton model repository, validating repositories, writing atomically.

Import the submodules directly (``tritonforge.render.plan``, ``.renderer``, ``.validate``,
``.write``, ``.commands``); this package module stays empty so importing the allow-list does
not pull in Jinja or protobuf.
"""

__all__: list[str] = []
