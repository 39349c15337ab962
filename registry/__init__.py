"""Known issues: EXPORT_SKIPS and ONNX_DISABLE_OPTIMIZE, each entry waiting on an upstream bug.

``registry.EXPORT_SKIPS`` and ``registry.ONNX_DISABLE_OPTIMIZE`` are ``{scope: {model class: entry}}`` read from
``registry/known_issues.toml``; ``Registry.load(path)`` reads another file.
"""

from .known_issues import (
    DEFAULT_PATH,
    LISTS,
    SCOPES,
    Entry,
    Problem,
    Registry,
    RegistryError,
    version_reached,
)


def __getattr__(name):
    if name in LISTS:
        return Registry.load().lists()[name]
    raise AttributeError(f"module 'registry' has no attribute {name!r}")


__all__ = ["DEFAULT_PATH", "LISTS", "SCOPES", "Entry", "Problem", "Registry", "RegistryError", "version_reached",
           "EXPORT_SKIPS", "ONNX_DISABLE_OPTIMIZE"]  # fmt: skip
