"""Every model class of the installed transformers, with its model type and tasks, and the filters that pick some.

The auto mappings (``MODEL_*_MAPPING_NAMES``) name most classes; public ``PreTrainedModel`` subclasses they miss
(sub-models like ``ClapTextModel``) are found by importing the modeling modules once per transformers version and
cached, since that takes seconds.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import random
import re
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from .store import write_text_atomic
from .tables import SMOKE_SET

BASE_TASK = "base"
# The mappings whose classes generate text: they get generate-mode cells.
GENERATIVE_TASKS = ("causal-lm", "seq-to-seq-causal-lm", "speech-seq-2-seq", "image-text-to-text")
EXTRA_TASK = "submodel"  # found outside the auto mappings


@dataclass(frozen=True)
class ModelClass:
    name: str
    model_type: str
    tasks: tuple[str, ...]
    module: str  # transformers module that defines it, e.g. "models.llama.modeling_llama"
    config: str  # its config class, "module:Name"

    @property
    def task(self) -> str:
        """The headline task: the most specific one."""
        specific = [task for task in self.tasks if task not in (BASE_TASK, "pretraining")]
        return specific[0] if specific else self.tasks[0]

    @property
    def generative(self) -> bool:
        return bool(set(self.tasks) & set(GENERATIVE_TASKS))

    @property
    def in_auto_mappings(self) -> bool:
        return self.tasks != (EXTRA_TASK,)

    def load(self):
        """The class object (imports its modeling module)."""
        import importlib

        import transformers

        if hasattr(transformers, self.name):
            return getattr(transformers, self.name)
        return getattr(importlib.import_module(f"transformers.{self.module}"), self.name)  # mapped, not exported

    def config_class(self):
        """The config class the auto mappings pair with this class (the class' own ``config_class`` may differ:
        a ``ForCausalLM`` of a multimodal model takes the text config)."""
        import importlib

        module, _, name = self.config.partition(":")
        return getattr(importlib.import_module(module), name)


class SelectionError(LookupError):
    """A filter matched nothing, or named a class that does not exist."""


def task_name(mapping_name: str) -> str:
    """``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` -> ``causal-lm``; ``MODEL_MAPPING_NAMES`` -> ``base``."""
    core = mapping_name.removeprefix("MODEL_").removesuffix("MAPPING_NAMES").removeprefix("FOR_").strip("_")
    return core.lower().replace("_", "-") or BASE_TASK


def auto_mappings() -> dict[str, dict[str, tuple[str, ...]]]:
    """``{task: {model type: class names}}`` from the installed auto mappings."""
    from transformers.models.auto import modeling_auto

    mappings = {}
    for name in sorted(dir(modeling_auto)):
        if name.startswith("MODEL") and name.endswith("MAPPING_NAMES"):
            mappings[task_name(name)] = {
                model_type: tuple(names) if isinstance(names, (list, tuple)) else (names,)
                for model_type, names in getattr(modeling_auto, name).items()
            }
    return mappings


def _model_folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "models" else ""


@cache
def all_model_classes() -> dict[str, ModelClass]:
    """Every class by name: the auto mappings' classes first, then the public subclasses they miss.

    Kept per transformers version (and per version of this enumeration): reading it back imports neither
    transformers nor torch, so a sweep whose cells are all unchanged does no import of either."""
    from importlib import metadata

    fingerprint = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    cache_file = _cache_dir() / f"classes-{metadata.version('transformers')}-{fingerprint}.json"
    if cache_file.is_file():
        try:
            return {name: ModelClass(**{**fields, "tasks": tuple(fields["tasks"])})
                    for name, fields in json.loads(cache_file.read_text()).items()}  # fmt: skip
        except (ValueError, TypeError, KeyError):
            pass  # enumerated again below
    classes = _enumerate_model_classes()
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(cache_file, json.dumps({name: as_dict(model) for name, model in classes.items()}))
    return classes


def _enumerate_model_classes() -> dict[str, ModelClass]:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    class_modules = transformers._class_to_module
    config_folder = {
        model_type: _model_folder(class_modules.get(config_name, "")) for model_type, config_name in CONFIG_MAPPING_NAMES.items()
    }
    seen: dict[str, dict] = {}
    for task, by_type in auto_mappings().items():
        for model_type, names in by_type.items():
            for name in names:
                entry = seen.setdefault(name, {"types": [], "tasks": []})
                if model_type not in entry["types"]:
                    entry["types"].append(model_type)
                if task not in entry["tasks"]:
                    entry["tasks"].append(task)
    classes = {}
    for name, entry in seen.items():
        module = class_modules.get(name) or _unexported_module(name, [config_folder.get(t, "") for t in entry["types"]])
        folder = _model_folder(module)
        # A class listed under several model types belongs to the one whose config lives in its own folder.
        types = sorted(
            entry["types"],
            key=lambda t: (config_folder.get(t) != folder, t.replace("-", "_") != folder, t),
        )
        config = CONFIG_MAPPING_NAMES[types[0]]
        config_module = f"transformers.{class_modules[config]}" if config in class_modules else "transformers"
        classes[name] = ModelClass(name, types[0], tuple(sorted(entry["tasks"])), module, f"{config_module}:{config}")
    for name, (model_type, module, config) in _extra_classes(frozenset(classes)).items():
        classes[name] = ModelClass(name, model_type, (EXTRA_TASK,), module, config)
    return classes


def _unexported_module(name: str, folders: list[str]) -> str:
    """The modeling module of a mapped class that transformers does not export (Voxtral Realtime's text model): the
    one of its model types' folders whose source defines it, or ``""``."""
    import importlib.util

    for folder in filter(None, folders):
        module = f"models.{folder}.modeling_{folder}"
        spec = importlib.util.find_spec(f"transformers.{module}")
        if spec and spec.origin and f"class {name}(" in Path(spec.origin).read_text():
            return module
    return ""


def _cache_dir() -> Path:
    root = os.environ.get("EXPORT_SWEEP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "export-sweep")
    return Path(root)


def _extra_classes(mapped: frozenset[str]) -> dict[str, tuple[str, str, str]]:
    """Public PreTrainedModel subclasses outside the mappings: ``{name: (model type, module, config)}``, cached."""
    import transformers

    cache_file = _cache_dir() / f"extra-classes-v3-{transformers.__version__}.json"
    if cache_file.is_file():
        try:
            return {name: tuple(value) for name, value in json.loads(cache_file.read_text()).items()}
        except (json.JSONDecodeError, ValueError):
            pass  # rebuilt below
    import torch
    from transformers import PreTrainedModel

    extras = {}
    for name, module in sorted(transformers._class_to_module.items()):
        if name in mapped or ".modeling_" not in module or name.endswith("PreTrainedModel"):
            continue
        try:
            value = getattr(transformers, name)
        except Exception:  # an optional dependency is missing: not enumerable here
            continue
        config_class = getattr(value, "config_class", None)
        abstract = "pretrained" in name.lower() or getattr(value, "forward", None) is torch.nn.Module.forward
        if abstract:  # base classes without a forward of their own (DPRPretrainedReader): nothing to run
            continue
        if isinstance(value, type) and issubclass(value, PreTrainedModel) and getattr(config_class, "model_type", ""):
            extras[name] = (config_class.model_type, module, f"{config_class.__module__}:{config_class.__name__}")
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps(extras, indent=0, sort_keys=True))
    return extras


def near_matches(name: str, candidates, count: int = 5) -> list[str]:
    candidates = list(candidates)
    close = difflib.get_close_matches(name, candidates, n=count, cutoff=0.6)
    lowered = name.lower().strip("*")
    substring = [c for c in candidates if lowered and lowered in c.lower() and c not in close]
    return (close + sorted(substring))[:count]


def _matches(pattern: str, name: str) -> bool:
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern == name


def select(
    models: str = "smoke",
    model_types: list[str] | None = None,
    tasks: list[str] | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[ModelClass]:
    """Classes picked by ``models`` (``smoke``, ``all``, or comma-separated names/globs) and the other filters, then
    ``sample`` of them drawn at random with ``seed`` (same seed, same classes), then the first ``limit``.

    Every pattern, model type and task must match something; the error lists near matches.
    """
    classes = all_model_classes()
    if models == "all":
        chosen = list(classes.values())
    else:
        patterns = list(SMOKE_SET) if models == "smoke" else [p.strip() for p in models.split(",") if p.strip()]
        if not patterns:
            raise SelectionError("--models is empty: give smoke, all, or class names and globs")
        chosen, picked = [], set()
        for pattern in patterns:
            hits = [model for name, model in classes.items() if _matches(pattern, name)]
            if not hits:
                what = "no class matches" if any(c in pattern for c in "*?[") else "no class named"
                hint = near_matches(pattern, classes)
                raise SelectionError(
                    f"{what} {pattern!r} in transformers"
                    + (f"; did you mean {', '.join(hint)}?" if hint else "")
                )
            for model in hits:
                if model.name not in picked:
                    picked.add(model.name)
                    chosen.append(model)
    if model_types:
        known = {model.model_type for model in classes.values()}
        for model_type in model_types:
            if model_type not in known:
                hint = near_matches(model_type, known)
                raise SelectionError(f"unknown model type {model_type!r}" + (f"; did you mean {', '.join(hint)}?" if hint else ""))
        chosen = [model for model in chosen if model.model_type in model_types]
    if tasks:
        known = {task for model in classes.values() for task in model.tasks}
        for task in tasks:
            if task not in known:
                hint = near_matches(task, known)
                raise SelectionError(f"unknown task {task!r}" + (f"; did you mean {', '.join(hint)}?" if hint else ""))
        chosen = [model for model in chosen if set(model.tasks) & set(tasks)]
    if not chosen:
        raise SelectionError("the filters together match no class")
    if sample is not None and sample < len(chosen):
        drawn = set(random.Random(seed).sample(sorted(model.name for model in chosen), sample))
        chosen = [model for model in chosen if model.name in drawn]
    return chosen[:limit] if limit else chosen


def in_selection(name: str, model_type: str, tasks, selection: dict) -> bool:
    """Whether the filters of ``selection`` (models, model_types, tasks) take a class, read from a record: tells a
    class gone from transformers (vanished) from one a narrower selection left out. Samples and limits are not
    filters: a selection with either is not complete."""
    models = selection.get("models") or "smoke"
    if models != "all":
        patterns = list(SMOKE_SET) if models == "smoke" else [p.strip() for p in models.split(",") if p.strip()]
        if not any(_matches(pattern, name) for pattern in patterns):
            return False
    if selection.get("model_types") and model_type not in selection["model_types"]:
        return False
    return not selection.get("tasks") or bool(set(tasks) & set(selection["tasks"]))


def shard(models: list[ModelClass], index: int, count: int, weights: dict[str, float] | None = None) -> list[ModelClass]:
    """Shard ``index`` of ``count`` (1-based): balanced by ``weights`` (seconds per class) when given, else by count.

    Greedy: heaviest class first onto the lightest shard, so every machine gets the same share of work.
    """
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: the index must be between 1 and {count}")
    weights = weights or {}
    default = (sum(weights.values()) / len(weights)) if weights else 1.0
    order = sorted(models, key=lambda model: (-weights.get(model.name, default), model.name))
    loads = [0.0] * count
    assignment: dict[str, int] = {}
    for model in order:
        target = min(range(count), key=lambda i: (loads[i], i))
        assignment[model.name] = target
        loads[target] += weights.get(model.name, default)
    return [model for model in models if assignment[model.name] == index - 1]


def parse_shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match:
        raise ValueError(f"--shard {text!r}: expected i/N, like 1/4")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard {text!r}: i must be between 1 and N")
    return index, count


def as_dict(model: ModelClass) -> dict:
    return asdict(model)
