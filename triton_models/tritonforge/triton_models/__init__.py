"""Model logic behind the generated Python models (thin ``model.py`` files import these).

Pure-logic modules (``preprocess``, ``postprocess``, ``detokenize``, ``engine``) have no
Triton import and are tested directly; the ``*_model`` modules adapt them to the Python
backend's ``TritonPythonModel`` interface.
"""
