"""Which versions are installed, and whether a version condition (``torch>=2.14``) holds for them.

Known issues say which release should make them unnecessary in one syntax, for registry entries and workarounds alike:
a package name, an operator and a version, like ``onnxscript>0.7.2``. Reading versions imports no package.
"""

from __future__ import annotations

import platform
import re
from importlib import metadata

VERSIONED_PACKAGES = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch")
VERSION_CONDITION = re.compile(r"^([A-Za-z][\w.-]*)\s*(==|!=|>=|<=|>|<|~=)\s*([\w.+-]+)$")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    versions["python"] = platform.python_version()
    return versions


def is_version_condition(text) -> bool:
    return isinstance(text, str) and VERSION_CONDITION.match(text) is not None


def condition_holds(condition: str | None, versions: dict[str, str | None]) -> bool | None:
    """Whether the installed versions satisfy ``condition``; None without a condition or without that package."""
    if not condition:
        return None
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    package, operator, version = VERSION_CONDITION.match(condition).groups()
    installed = versions.get(package)
    if installed is None:
        return None
    return Version(installed.split("+")[0]) in SpecifierSet(f"{operator}{version}")
