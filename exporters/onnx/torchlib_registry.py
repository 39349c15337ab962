"""torch.onnx's registry of torchlib translations built once per process, not at every export: a cost cut, not a
workaround.

``torch.onnx.export`` builds an ``ONNXRegistry`` from torchlib at each call: it reads every torchlib function and
infers its ONNX signature by parsing its annotations, about a fifth of a static ONNX export of a tiny model
(docs/performance.md). The result depends only on the installed torch and onnxscript and on the opset. While
``torchlib_registry_built_once()`` is active, each export gets a copy of one registry built per opset: the lists of
translations are its own (the export adds ours to them), the translations themselves are shared (nothing changes
them once built). The ONNX programs are the same.

No upstream issue asks for it; torch.onnx keeping the torchlib registry it builds, per opset, and handing each export
a copy would make this module unneeded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_BUILT: dict[tuple[type, int], object] = {}  # by registry class and opset


@contextlib.contextmanager
def torchlib_registry_built_once() -> Iterator[None]:
    """While active, ``ONNXRegistry.from_torchlib`` returns a copy of the registry it built for that opset before."""
    from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    original = ONNXRegistry.__dict__["from_torchlib"]
    build = original.__func__

    def from_torchlib(cls, opset_version=TORCHLIB_OPSET):
        key = (cls, opset_version)
        if key not in _BUILT:
            _BUILT[key] = build(cls, opset_version=opset_version)
        built = _BUILT[key]
        registry = cls()
        registry.__dict__.update(built.__dict__)
        registry.functions = {target: list(translations) for target, translations in built.functions.items()}
        return registry

    ONNXRegistry.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        ONNXRegistry.from_torchlib = original
