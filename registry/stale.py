"""Which registry entries are no longer needed, each finding with its evidence.

Four checks, in order of weight:

1. vanished: the class no longer exists in the installed transformers;
2. passes now: the cells the entry governs, re-run without it (no skip; the optimizer on), pass with parity;
3. version reached: the installed versions satisfy the entry's ``fixed_when``;
4. upstream closed: its GitHub issue is closed as done, or its pull request merged (unknown when offline).

An entry none of them flags is ``still needed``; one whose issue was closed without a fix (not planned, a
duplicate, a pull request not merged) is too, with that verdict.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from .github import GitHubClient, is_closed, is_fixed
from .known_issues import Entry, Registry, version_reached

WITHOUT_A_FIX = "upstream closed without a fix"


@dataclass
class Finding:
    entry: Entry
    verdict: str = "still needed"
    stale: bool = False
    evidence: list[str] = field(default_factory=list)
    upstream: str = "unknown (not checked)"
    passes_now: bool | None = None

    def as_dict(self) -> dict:
        return {**self.entry.as_dict(), "verdict": self.verdict, "stale": self.stale, "evidence": self.evidence,
                "upstream": self.upstream, "passes_now": self.passes_now}  # fmt: skip


def check_entries(
    registry: Registry,
    entries: list[Entry],
    known_classes,
    versions: dict,
    github: GitHubClient,
    rerun=None,
) -> list[Finding]:
    """Judge each entry. ``rerun(entries) -> {entry label: [records]}`` re-runs governed cells (None: skip check 2)."""
    findings = {entry.label(): Finding(entry) for entry in entries}
    for finding in findings.values():
        entry = finding.entry
        if entry.model not in known_classes:
            finding.evidence.append("vanished: the class is not in the installed transformers")
        reached = version_reached(entry, versions)
        if reached:
            finding.evidence.append(f"version reached: {entry.fixed_when} holds for the installed versions")
        elif reached is False:
            finding.evidence.append(f"version not reached: {entry.fixed_when}")
        answer = github.state(entry.url)
        finding.upstream = answer["state"]
        finding.evidence.append(f"upstream {entry.url}: {answer['state']}" + (" (cached)" if answer.get("cached") else ""))
    if rerun is not None:
        runnable = [f.entry for f in findings.values() if f.entry.model in known_classes]
        for label, records in rerun(runnable).items():
            finding = findings[label]
            finding.passes_now = bool(records) and all(record.status == "pass" for record in records)
            for record in records:
                detail = f"{record.cell_id}: {record.status} at {record.stage}"
                if record.max_abs_diff is not None:
                    detail += f" (max abs diff {record.max_abs_diff:.2g})"
                finding.evidence.append(("passes now: " if record.status == "pass" else "re-run: ") + detail)
    for finding in findings.values():
        entry = finding.entry
        if entry.model not in known_classes:
            finding.verdict = "vanished"
        elif finding.passes_now:
            finding.verdict = "passes now"
        elif version_reached(entry, versions):
            finding.verdict = "version reached"
        elif is_fixed(finding.upstream):
            finding.verdict = f"upstream {finding.upstream}"
        elif is_closed(finding.upstream):  # not planned, a duplicate, not merged: no fix to wait for there
            finding.verdict = f"{WITHOUT_A_FIX} {finding.upstream.removeprefix('closed ')}"
        elif finding.upstream.startswith("unknown") and finding.passes_now is None:
            finding.verdict = f"unknown: {finding.upstream}"
        finding.stale = finding.verdict != "still needed" and not finding.verdict.startswith(("unknown", WITHOUT_A_FIX))
    return list(findings.values())


def rerun_governed_cells(registry: Registry, out: Path, jobs: int, timeout: float, shapes=("static", "dynamic")):
    """A ``rerun`` for ``check_entries``: every cell an entry governs, run without any registry entry."""
    if jobs < 1:  # a guard: with no worker the sweep would wait for ever
        raise ValueError(f"jobs must be 1 or more, not {jobs}")
    from harness.models import all_model_classes
    from harness.store import RunStore
    from harness.sweep import Plan, Progress, run_sweep
    from harness.workers import WorkerOptions, warm_imports

    def rerun(entries: list[Entry]) -> dict[str, list]:
        classes = all_model_classes()
        wanted: dict[str, set[str]] = {}
        cells: dict[str, list[str]] = {}
        for entry in entries:
            ids = [f"{entry.model}-{backend}-{shape}" for backend, shape in registry.cells_of(entry, shapes=shapes)]
            cells[entry.label()] = ids
            wanted.setdefault(entry.model, set()).update(ids)
        if not wanted:
            return {}
        store = RunStore(out)
        store.create({"purpose": "stale check", "registry": str(registry.path)}, resume=True)
        backends = sorted({cell.split("-")[-2] for ids in wanted.values() for cell in ids})
        warm_imports(backends)
        plan = Plan([classes[name] for name in wanted], tuple(backends), tuple(shapes),
                    only={cell for ids in wanted.values() for cell in ids})  # fmt: skip
        run_sweep(plan, store, WorkerOptions(timeout=timeout, log_dir=store.logs_dir), jobs, registry=None,
                  progress=Progress(plan.total))  # fmt: skip
        store.finish()
        present = store.cell_ids()
        return {label: [store.read(cell) for cell in ids if cell in present] for label, ids in cells.items()}

    return rerun


def print_table(findings: list[Finding], stream=sys.stdout) -> None:
    rows = [("list", "class", "scope", "verdict", "upstream")]
    rows += [(f.entry.list, f.entry.model, f.entry.scope, f.verdict, f.upstream) for f in findings]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        stream.write("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() + "\n")
        if number == 0:
            stream.write("  ".join("-" * width for width in widths) + "\n")
    stale = sum(f.stale for f in findings)
    stream.write(f"{len(findings)} entries, {stale} stale\n")
