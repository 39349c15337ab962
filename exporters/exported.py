"""An exported artifact: call it like the model, save it, load it back.

``exported(**inputs)`` runs the artifact in its own runtime and returns ``{output name: tensor}``, named and ordered
like the eager model's outputs flattened with :func:`exporters.leaves.named_leaves`, so parity is one comparison.
Each backend's artifact (its runtime) subclasses ``Exported`` in ``exporters/<backend>/runtime.py``;
``exporters.load`` (:mod:`exporters.backends`) reads one back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from .leaves import constant_value, named_leaves
from .versions import package_versions

METADATA_FILE = "export.json"
def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


class Exported:
    """Base of the three artifacts. Subclasses set ``backend``/``program_file`` and implement the runtime hooks."""

    backend: ClassVar[str]
    program_file: ClassVar[str]

    def __init__(self, program: Any, metadata: dict):
        self.program = program
        self.metadata = metadata

    @property
    def input_names(self) -> list[str]:
        return self.metadata["input_names"]

    @property
    def output_names(self) -> list[str]:
        return self.metadata["output_names"]

    @property
    def applied(self) -> list[str]:
        """The workarounds that fired during this export."""
        return self.metadata.get("applied", [])

    def __call__(self, **inputs) -> dict[str, Any]:
        constants = self.metadata.get("constants", {})
        traced = {}
        for name, value in inputs.items():
            if name in constants:
                value = _jsonable(constant_value(name, value))
                if value != constants[name]:
                    raise ValueError(
                        f"{name}={value!r} differs from the value baked into this {self.backend} export "
                        f"({constants[name]!r}); export again to change it"
                    )
            else:
                traced[name] = value
        from .pytree import object_state_difference  # imports torch, which reading package_versions must not

        for name, baked in self.metadata.get("object_states", {}).items():
            difference = object_state_difference(traced[name], baked) if name in traced else None
            if difference:
                raise ValueError(f"{name} differs from the state baked into this {self.backend} export ({difference});"
                                 " export again to change it")
        return self.run_named(named_leaves(traced))

    def run_named(self, named: dict[str, Any]) -> dict[str, Any]:
        """Run with the input tensors given by name (``past_key_values.layers.0.keys``): a generation loop feeds one
        step's outputs to the next step this way, without rebuilding cache objects."""
        missing = [name for name in self.input_names if name not in named]
        if missing:
            raise TypeError(f"{self.backend} artifact is missing inputs: {', '.join(missing)}")
        outputs = self._run([named[name].contiguous() for name in self.input_names])
        if len(outputs) != len(self.output_names):
            raise RuntimeError(
                f"{self.backend} artifact returned {len(outputs)} outputs, its export recorded "
                f"{len(self.output_names)} ({', '.join(self.output_names)})"
            )
        return dict(zip(self.output_names, outputs))

    def load_runtime(self) -> Exported:
        """Open the artifact in its runtime now (the first call would otherwise do it): a timed, separate step."""
        self._runtime()
        return self

    def _runtime(self):
        raise NotImplementedError

    def _run(self, feed: list[Any]) -> list[Any]:
        """Run the program on its input tensors, in ``input_names`` order; its outputs in ``output_names`` order."""
        raise NotImplementedError

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_program(directory / self.program_file)
        (directory / METADATA_FILE).write_text(json.dumps(self.metadata, indent=1, default=repr))
        return directory

    def _save_program(self, path: Path) -> None:
        raise NotImplementedError

    @classmethod
    def load_saved(cls, directory: Path, metadata: dict) -> Exported:
        """The artifact saved in ``directory``, its metadata read already (``exporters.load`` reads it)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.metadata.get('model_class', '?')}: {len(self.input_names)} inputs, {len(self.output_names)} outputs>"


def build_metadata(backend: str, model, traced, config, log) -> dict:
    from dataclasses import asdict

    return {
        "backend": backend,
        "model_class": type(model).__name__,
        "input_names": list(traced.input_names),
        "output_names": list(traced.output_names),
        "input_shapes": traced.input_shapes(),
        "constants": {name: _jsonable(value) for name, value in traced.constants.items()},
        "object_states": traced.object_states(),
        "config": {key: _jsonable(value) for key, value in asdict(config).items()},
        "stages": log.stages,
        "applied": log.applied,
        "versions": package_versions(),
    }

