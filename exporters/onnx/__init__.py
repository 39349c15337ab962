"""The ONNX backend: the Dynamo trace converted by ``torch.onnx`` (``exporter.py``), run by ONNX Runtime
(``runtime.py``); its workarounds in ``workarounds.py``, in stage order. Importing this package registers every ONNX
workaround (and the Dynamo ones it traces through).
"""

from . import workarounds  # noqa: F401  (registers the ONNX workarounds)
from .exporter import OnnxConfig, OnnxExporter
from .runtime import OnnxExported, open_session

__all__ = ["OnnxConfig", "OnnxExported", "OnnxExporter", "open_session"]
