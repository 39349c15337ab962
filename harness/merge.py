"""Shard runs merged into one run folder, all or nothing.

Everything is read and checked first (every record parses, no cell in two shards, every shard ran the same plan and
a shard of it once); the merged folder is built beside the target under a temporary name and renamed into place at
the end, so a merge that fails leaves nothing behind and can simply be run again. A shard of the plan that no folder
brings is named, and its cells are ``missing`` in the merged run (the plan is copied there: it says what was
expected); so is a shard that stopped before its end.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .ledger import WORKAROUNDS_FILE
from .plan import SweepPlan, plan_of_run
from .store import CELLS_DIR, LOGS_DIR, RUN_FILE, PLAN_FILE, RunStore, fsync_folder, write_json_atomic


@dataclass
class Merged:
    cells: int
    sources: list[Path]
    plan: SweepPlan | None = None
    missing_shards: list[int] = field(default_factory=list)
    unfinished_shards: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def merge_runs(out: str | Path, runs, plan_path: str | Path | None = None, say=print) -> Merged:
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} is not empty: merge into a new or empty folder")
    sources = _shard_runs([Path(run) for run in runs], say)
    plan = SweepPlan.load(plan_path) if plan_path else _common_plan(sources)
    shard_of = _shard_indexes(sources, plan)
    files: dict[str, Path] = {}
    counts: Counter = Counter()
    for source in sources:
        for record in source.records():  # a corrupt record stops the merge here, naming its file
            if record.cell_id in files:
                raise ValueError(f"cell {record.cell_id} is in both {files[record.cell_id].parent.parent} and {source.directory}")
            if plan is not None and plan.shard_of(record.cell_id) is None:
                raise ValueError(f"{source.directory} holds cell {record.cell_id}, which its plan does not list")
            files[record.cell_id] = source.path_for(record.cell_id)
            counts[record.status] += 1
    merged = Merged(len(files), [source.directory for source in sources], plan, counts=dict(counts))
    if plan is not None:
        merged.missing_shards = [index for index in range(1, plan.shards + 1) if index not in shard_of.values()]
        for index in merged.missing_shards:
            say(f"shard {index}/{plan.shards} is missing: no run folder brought it; its {len(plan.cells(index))} cells "
                "are recorded missing")  # fmt: skip
    metadata = [source.metadata() for source in sources]
    for source, meta in zip(sources, metadata):
        if not meta.get("finished_at"):
            index = shard_of.get(source.directory)
            merged.unfinished_shards.append(index)
            say(f"{source.directory} (shard {index}) did not finish: the cells it did not run are missing")
    _build(out, sources, metadata, files, plan, shard_of, merged)
    return merged


def _shard_runs(paths: list[Path], say) -> list[RunStore]:
    sources = []
    for path in paths:
        if not path.is_dir():
            raise FileNotFoundError(f"shard run {path}: no such folder")
        store = RunStore(path)
        if not (path / RUN_FILE).is_file():
            if store.cell_ids():
                raise FileNotFoundError(f"shard run {path} holds cell records but no {RUN_FILE}: not a whole run")
            say(f"{path}: no {RUN_FILE} and no cells, not a shard run: left out")
            continue
        sources.append(store)
    if not sources:
        raise FileNotFoundError("no shard run to merge: " + ", ".join(str(path) for path in paths))
    return sources


def _common_plan(sources: list[RunStore]) -> SweepPlan | None:
    """The plan every shard ran; None when none has one (shards of a sweep from before plans)."""
    plans = [(source.directory, plan_of_run(source.directory)) for source in sources]
    with_plan = [(directory, plan) for directory, plan in plans if plan is not None]
    if not with_plan:
        return None
    first_dir, first = with_plan[0]
    for directory, plan in plans:
        if plan is None:
            raise ValueError(f"{directory} has no {PLAN_FILE}, {first_dir} has: not shards of one sweep")
        if plan.digest != first.digest:
            raise ValueError(f"{directory} ran plan {plan.digest}, {first_dir} ran {first.digest}: not shards of one sweep")
    return first


def _shard_indexes(sources: list[RunStore], plan: SweepPlan | None) -> dict[Path, int | None]:
    indexes: dict[Path, int | None] = {}
    if plan is None:
        return {source.directory: None for source in sources}
    claimed: dict[int, Path] = {}
    for source in sources:
        meta = source.metadata().get("plan") or {}
        index = meta.get("shard")
        if index is None and plan.shards == 1:
            index = 1
        if not isinstance(index, int) or not 1 <= index <= plan.shards:
            raise ValueError(f"{source.directory}: run.json names no shard of the {plan.shards} of plan {plan.digest}")
        if meta.get("digest") not in (None, plan.digest):
            raise ValueError(f"{source.directory} ran plan {meta.get('digest')}, not {plan.digest}")
        if index in claimed:
            raise ValueError(f"shard {index}/{plan.shards} is both {claimed[index]} and {source.directory}")
        claimed[index] = source.directory
        indexes[source.directory] = index
    return indexes


def _build(out: Path, sources, metadata, files, plan, shard_of, merged: Merged) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    building = out.parent / f".{out.name}.merging-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    try:
        (building / CELLS_DIR).mkdir(parents=True)
        for path in files.values():
            shutil.copyfile(path, building / CELLS_DIR / path.name)
        listing = next((s.directory / WORKAROUNDS_FILE for s in sources if (s.directory / WORKAROUNDS_FILE).is_file()), None)
        if listing is not None:  # the shards ran one commit: one listing
            shutil.copyfile(listing, building / WORKAROUNDS_FILE)
        for source in sources:
            if source.logs_dir.is_dir():
                shutil.copytree(source.logs_dir, building / LOGS_DIR, dirs_exist_ok=True)
        run = dict(metadata[0])
        run["started_at"] = min((m.get("started_at") or "" for m in metadata), default="") or None
        finished = [m.get("finished_at") for m in metadata]
        run["finished_at"] = max(finished) if all(finished) else None
        run["shards"] = [
            {"dir": str(s.directory), "index": shard_of.get(s.directory), "cells": len(s.cell_ids()),
             **{k: m.get(k) for k in ("started_at", "finished_at", "options", "versions")}}
            for s, m in zip(sources, metadata)
        ]  # fmt: skip
        run["missing_shards"] = merged.missing_shards
        run["counts"] = merged.counts
        if plan is not None:
            plan.save(building / PLAN_FILE)
            run["plan"] = {"digest": plan.digest, "shard": None, "shards": plan.shards, "cells": len(plan.cells())}
        write_json_atomic(building / RUN_FILE, run)
        os.rename(building, out)  # over an empty folder too; a non-empty one was refused before any work
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    fsync_folder(out.parent)
