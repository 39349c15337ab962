"""The sweep plan: which cells a sweep is to run, and on which shard, written once and read by every shard.

A plan is ``plan.json``: the selection that made it (so a class gone from transformers can be told from one the
selection left out), the backends and shape modes, the shard count, and per class its shard and cells. The nightly
writes it in one job from the baseline's class times and hands it to every shard, so shards planned on different
machines can neither overlap nor leave a class out; ``merge`` reads it to know what each shard was to bring, and turns
what none brought into ``missing`` cells. Every run folder keeps the plan it ran (``RUN/plan.json``) beside the
shard it ran (``run.json`` options).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from exporters.backends import BACKENDS

from .cache import class_weights
from .models import ModelClass, all_model_classes, parse_shard, select, shard
from .records import DTYPES, SHAPE_MODES, parse_cell_id
from .store import PLAN_FILE, now, read_json, require_run, write_json_atomic
from .sweep import Plan, cells_of

DEFAULT_SHAPES = ("static", "dynamic")

PLAN_SCHEMA = 1


class PlanError(ValueError):
    """A plan file is malformed, or does not fit what it is used for; the message names the file and the field."""


@dataclass
class SweepPlan:
    selection: dict  # models, model_types, tasks, limit, sample, seed: what picked the classes
    backends: list[str]
    shapes: list[str]
    shards: int = 1
    classes: dict[str, dict] = field(default_factory=dict)  # name -> {"shard": i, "cells": [...], "seconds": s}
    created_at: str = ""
    weights_from: str | None = None  # the run whose class times balanced the shards
    dtypes: list[str] = field(default_factory=lambda: list(DTYPES[:1]))

    @property
    def complete(self) -> bool:
        """Every class the selection's filters take is planned: a class they take that is not here has left
        transformers. A sample or a limit leaves classes out on purpose."""
        return not (self.selection.get("limit") or self.selection.get("sample"))

    @property
    def digest(self) -> str:
        """Names the plan: shards of one sweep carry the same digest."""
        parts = [self.selection, self.backends, self.shapes, self.shards, self.classes]
        parts += [self.dtypes] if self.dtypes != list(DTYPES[:1]) else []  # float32 alone: the digest plans had before
        body = json.dumps(parts, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def class_names(self, shard_index: int | None = None) -> list[str]:
        return [name for name, entry in self.classes.items() if shard_index is None or entry["shard"] == shard_index]

    def cells(self, shard_index: int | None = None) -> list[str]:
        return [cell for name in self.class_names(shard_index) for cell in self.classes[name]["cells"]]

    def shard_of(self, cell: str) -> int | None:
        model = parse_cell_id(cell)[0]
        entry = self.classes.get(model)
        return entry["shard"] if entry and cell in entry["cells"] else None

    def estimated_seconds(self) -> dict[str, float]:
        """Seconds per cell as the weighing run measured them (a class' time spread over its cells)."""
        estimates = {}
        for entry in self.classes.values():
            if entry.get("seconds"):
                for cell in entry["cells"]:
                    estimates[cell] = entry["seconds"] / len(entry["cells"])
        return estimates

    # ── file ──
    def to_dict(self) -> dict:
        return {"schema": PLAN_SCHEMA, "created_at": self.created_at, "digest": self.digest,
                "selection": self.selection, "complete": self.complete, "backends": self.backends,
                "shapes": self.shapes, "dtypes": self.dtypes, "shards": self.shards, "weights_from": self.weights_from,
                "classes": self.classes}  # fmt: skip

    def save(self, path: Path) -> Path:
        write_json_atomic(Path(path), self.to_dict())
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> SweepPlan:
        path = Path(path)
        if path.is_dir():
            path = path / PLAN_FILE
        if not path.is_file():
            raise PlanError(f"{path}: no such plan file")
        data = read_json(path)
        _check(path, data)
        plan = cls(data["selection"], data["backends"], data["shapes"], data["shards"], data["classes"],
                   data.get("created_at", ""), data.get("weights_from"), data.get("dtypes", list(DTYPES[:1])))  # fmt: skip
        if data.get("digest") not in (None, plan.digest):
            raise PlanError(f"{path}: digest {data['digest']} does not match its content ({plan.digest}): edited by hand?")
        return plan


def _check(path: Path, data: dict) -> None:
    """Every field with its type, so a plan that would mislead a shard is refused before anything runs."""

    def fail(field_name: str, expected: str) -> None:
        raise PlanError(f"{path}: field {field_name!r} must be {expected}, found {data.get(field_name)!r:.80}")

    if data.get("schema") != PLAN_SCHEMA:
        fail("schema", str(PLAN_SCHEMA))
    if not isinstance(data.get("selection"), dict):
        fail("selection", "an object")
    for name, known in (("backends", BACKENDS), ("shapes", SHAPE_MODES), ("dtypes", DTYPES)):
        values = data.get(name, list(DTYPES[:1])) if name == "dtypes" else data.get(name)
        if not isinstance(values, list) or not values or any(value not in known for value in values):
            fail(name, f"a list of {', '.join(known)}")
    shards = data.get("shards")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        fail("shards", "a whole number >= 1")
    classes = data.get("classes")
    if not isinstance(classes, dict):
        fail("classes", "an object of class name -> {shard, cells}")
    for name, entry in classes.items():
        where = f"classes.{name}"
        if not isinstance(entry, dict):
            raise PlanError(f"{path}: {where} must be an object")
        if not isinstance(entry.get("shard"), int) or not 1 <= entry["shard"] <= shards:
            raise PlanError(f"{path}: {where}.shard must be a whole number from 1 to {shards}, found {entry.get('shard')!r}")
        cells = entry.get("cells")
        if not isinstance(cells, list) or not all(isinstance(c, str) and c.startswith(f"{name}-") for c in cells):
            raise PlanError(f"{path}: {where}.cells must be a list of this class' cell ids")


def make_plan(models: list[ModelClass], backends, shapes, selection: dict, shards: int = 1,
              weights: dict[str, float] | None = None, weights_from: str | None = None,
              dtypes=DTYPES[:1]) -> SweepPlan:  # fmt: skip
    """Assign every class to a shard (heaviest first onto the lightest shard when ``weights`` are known)."""
    if shards < 1:
        raise PlanError(f"a plan needs at least one shard, not {shards}")
    assignment = {m.name: index for index in range(1, shards + 1) for m in shard(models, index, shards, weights)}
    classes = {}
    for model in models:
        entry = {"shard": assignment[model.name], "cells": [cell.id for cell in cells_of(model, backends, shapes, dtypes)]}
        if weights and model.name in weights:
            entry["seconds"] = round(weights[model.name], 2)
        classes[model.name] = entry
    return SweepPlan(dict(selection), list(backends), list(shapes), shards, classes, now(), weights_from, list(dtypes))


def cell_plan(plan: SweepPlan, classes: list[ModelClass], **options) -> Plan:
    """What a sweep of ``classes`` runs under ``plan``: its backends, shapes and dtypes (``options``: done, only)."""
    return Plan(classes, tuple(plan.backends), tuple(plan.shapes), tuple(plan.dtypes), **options)


def select_plan(models: str = "smoke", model_types=None, tasks=None, limit=None, sample=None, seed: int = 0,
                shard: str | None = None, shard_weights: Path | None = None, plan_file: Path | None = None,
                backends=None, shapes=None, dtypes=None) -> tuple[SweepPlan, int | None]:  # fmt: skip
    """``(plan, shard index or None)``: read from ``plan_file``, or made from the selection (``backends``,
    ``shapes``, ``dtypes`` None: the plan's, or every backend, static + dynamic, float32). Errors name the option to
    change."""
    index = count = None
    if shard:
        index, count = parse_shard(shard)
    if plan_file:
        given = [option for option, value in (("--model-types", model_types), ("--tasks", tasks), ("--sample", sample),
                                              ("--limit", limit), ("--shard-weights", shard_weights)) if value]  # fmt: skip
        given += ["--models"] if models not in ("smoke", "all") else []
        if given:
            raise ValueError(f"--plan says which classes run: drop {', '.join(given)}")
        plan = SweepPlan.load(plan_file)
        if count is not None and count != plan.shards:
            raise ValueError(f"--shard {shard}: the plan {plan_file} has {plan.shards} shards")
        if plan.shards > 1 and index is None:
            raise ValueError(f"the plan {plan_file} has {plan.shards} shards: say which with --shard i/{plan.shards}")
        differs = [(option, given, planned) for option, given, planned in
                   (("--backends", backends, plan.backends), ("--shapes", shapes, plan.shapes),
                    ("--dtypes", dtypes, plan.dtypes)) if given and set(given) != set(planned)]  # fmt: skip
        if differs:
            raise ValueError(
                f"the plan {plan_file} is for backends {','.join(plan.backends)}, shapes {','.join(plan.shapes)} and "
                f"dtypes {','.join(plan.dtypes)}: drop {'/'.join(option for option, *_ in differs)}, or make another plan"
            )
        known = all_model_classes()
        gone = [name for name in plan.class_names(index) if name not in known]
        if gone:
            raise LookupError(
                f"the plan {plan_file} names {len(gone)} classes the installed transformers does not have "
                f"({', '.join(gone[:5])}): it was made with other versions; make the plan where the shards run"
            )
        return plan, index
    selection = {"models": models, "model_types": model_types, "tasks": tasks, "limit": limit, "sample": sample,
                 "seed": seed}  # fmt: skip
    classes = select(models, model_types, tasks, limit, sample, seed)
    weights, weights_from = {}, None
    if shard_weights is not None:
        require_run(shard_weights, "--shard-weights")
        weights, weights_from = class_weights(shard_weights), str(shard_weights)
    plan = make_plan(classes, backends or BACKENDS, shapes or DEFAULT_SHAPES, selection, shards=count or 1,
                     weights=weights, weights_from=weights_from, dtypes=dtypes or DTYPES[:1])  # fmt: skip
    return plan, index


def planned_classes(plan: SweepPlan, shard_index: int | None = None) -> list[ModelClass]:
    known = all_model_classes()
    return [known[name] for name in plan.class_names(shard_index)]


def plan_of_run(run_dir: Path) -> SweepPlan | None:
    """The plan a run folder ran, or None for a run written before plans (its records are all it expected)."""
    path = Path(run_dir) / PLAN_FILE
    return SweepPlan.load(path) if path.is_file() else None
