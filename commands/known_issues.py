"""The known issues' commands: ``registry`` (check, add), ``stale`` (registry entries and workarounds alike) and
``workarounds`` (the ledger of a run)."""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from exporters.versions import package_versions
from exporters.workarounds import ledger
from harness.cache import default_cache_dir
from harness.ledger import ledger_rows, read_listing
from harness.models import all_model_classes, select
from harness.store import write_text_atomic
from registry import Entry, Registry, RegistryError
from registry.github import GitHubClient
from registry.stale import check_entries, print_table, rerun_governed_cells
from registry.workaround_stale import check_workarounds, print_findings, rerun_without_workaround

from .inputs import existing_run


def cmd_registry(args) -> int:
    try:
        registry = Registry.load(args.registry)
        if args.registry_command == "check":
            problems = registry.check(all_model_classes())
            for problem in problems:
                print(problem, file=sys.stderr)
            print(f"{registry.path}: {len(registry.entries)} entries, {len(problems)} problems")
            return 1 if problems else 0
        entry = Entry(args.list, args.model, args.scope, args.reason, args.url, args.fixed_when)
        added = registry.add(entry, known_classes=all_model_classes())
        print(f"{registry.path}:{added.line}: added {added.label()}")
        return 0
    except RegistryError as error:
        print(f"export-sweep registry: {error}", file=sys.stderr)
        return 2


def run_ledger(run, backends=None) -> list[dict]:
    """The ledger rows of a run (its cells' ``applied``) over the workarounds of the code installed now."""
    rows = ledger(tuple(backends)) if backends else ledger()
    return ledger_rows(rows, run.records(errors=[]) if run is not None else [])


def cmd_workarounds(args) -> int:
    run = existing_run(args.run_dir, "run")
    listing = (read_listing(run.directory) if run is not None else None) or (ledger(tuple(args.backends)) if args.backends else ledger())
    rows = ledger_rows(listing, run.records(errors=[]) if run is not None else [])
    if args.backends:
        rows = [row for row in rows if row["backend"] in args.backends]
    if args.json:
        print(json.dumps({"run": str(run.directory) if run else None, "workarounds": rows}, indent=1))
        return 0
    for row in rows:
        waits = row["upstream"] or _model_side(row["model_side"])
        fired = f"fired {len(row['fired'])}, failing {len(row['failing'])}" if run is not None else ""
        print(f"{row['backend']:<10} {row['name']:<60} {row['kind']:<16} {row['stage']:<20} {fired:<26} {waits[:110]}")
    linked = sum(bool(row["upstream"]) for row in rows)
    print(f"{len(rows)} workarounds: {linked} linked upstream, {len(rows) - linked} with the change that would remove "
          f"them named")  # fmt: skip
    return 0


def _model_side(text: str | None) -> str:
    if not text:
        return "-"
    return text if text.startswith("upstream change:") else f"model side: {text}"


def cmd_stale(args) -> int:
    registry = Registry.load(args.registry)
    known = all_model_classes()
    entries = registry.entries
    if args.models != "all" or args.model_types or args.tasks:
        chosen = {model.name for model in select(args.models, args.model_types, args.tasks, args.limit)}
        entries = [entry for entry in entries if entry.model in chosen]
    run = existing_run(args.run, "--run")
    if args.workarounds and run is None:
        raise ValueError("stale --workarounds needs --run RUN: the run whose cells each workaround fired on")
    cache_dir = args.cache_dir or default_cache_dir()
    github = GitHubClient(cache_file=Path(cache_dir) / "github.json", offline=args.offline)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="export-sweep-stale-"))
    versions = package_versions()
    findings = check_entries(registry, entries, known, versions, github,
                             rerun_governed_cells(registry, out, args.jobs, args.timeout))  # fmt: skip
    print_table(findings)
    report = {"checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "registry": str(registry.path),
              "offline": bool(args.offline), "run": str(out), "entries": [f.as_dict() for f in findings]}  # fmt: skip
    stale = [f for f in findings if f.stale]
    if args.workarounds:
        rows = run_ledger(run)
        if args.names:
            unknown = sorted(set(args.names) - {row["name"] for row in rows})
            if unknown:
                raise LookupError(f"--names: no workaround named {', '.join(unknown)} (export-sweep workarounds lists them)")
            rows = [row for row in rows if row["name"] in args.names]
        seconds = {record.cell_id: record.seconds for record in run.records(errors=[])}
        budget = args.budget_minutes * 60 if args.budget_minutes else None
        rerun = rerun_without_workaround(out / "workarounds", args.jobs, args.timeout, registry)
        checked = check_workarounds(rows, seconds, versions, github, rerun, args.per_workaround, budget)
        print_findings(checked, sys.stdout)
        report["workarounds"] = [finding.as_dict() for finding in checked]
        report["workarounds_run"] = str(run.directory)
        stale += [finding for finding in checked if finding.stale]
    json_path = Path(args.json) if args.json else out / "stale.json"
    write_text_atomic(json_path, json.dumps(report, indent=1))
    print(f"findings: {json_path}")
    if args.fix:
        passing = [f.entry for f in findings if f.verdict == "passes now"]
        if passing:
            registry.save(registry.without(passing))
            print(f"{registry.path}: removed {len(passing)} entries that pass now: "
                  + ", ".join(entry.label() for entry in passing))  # fmt: skip
        else:
            print(f"{registry.path}: nothing to remove")
    return 1 if args.strict and stale else 0
