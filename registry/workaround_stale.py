"""Which workarounds are no longer needed, each verdict with its evidence: a workaround is a known issue too.

For each workaround (a row of the run's ledger), in order of weight:

1. target gone: a path it patches no longer resolves in the installed versions;
2. not needed on the cells tried: re-run without it (``disabled_workarounds``) on up to K of the cells it fired
   on, cheapest first, they all pass;
3. version reached: the installed versions satisfy its ``fixed_when``;
4. upstream closed: its issue is closed as done, or its pull request merged;
5. still needed: a cell re-run without it fails (its stage and bucket are the evidence);
6. never fires: no cell of the run applied it.

Nothing is deleted: a verdict says what could go and which classes to sweep after removing it. Re-runs stop at the
time budget; the workarounds left are ``not checked``, cheapest checks first so a budget covers the most.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from exporters.registration import resolve_path
from exporters.versions import condition_holds
from harness.records import parse_cell_id

from .github import GitHubClient, is_fixed

STALE_VERDICTS = ("target gone", "never fires", "not needed on the cells tried", "version reached", "upstream closed")
# Verdicts the version and the upstream state cannot change: a gone target or a passing re-run says more
FINAL = ("target gone", "not needed on the cells tried", "backend setup: not checked",
         "not checked (it cannot be turned off)", "gone from the code since that run")  # fmt: skip


@dataclass
class WorkaroundFinding:
    name: str
    backend: str
    kind: str
    verdict: str = "not checked"
    evidence: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)  # the cells re-run without it
    sweep_after: list[str] = field(default_factory=list)  # the classes it fired on: what to sweep once it is gone
    upstream: str | None = None
    upstream_state: str | None = None

    @property
    def stale(self) -> bool:
        return self.verdict in STALE_VERDICTS

    def as_dict(self) -> dict:
        return {"name": self.name, "backend": self.backend, "kind": self.kind, "verdict": self.verdict,
                "stale": self.stale, "evidence": self.evidence, "tried": self.tried, "sweep_after": self.sweep_after,
                "upstream": self.upstream, "upstream_state": self.upstream_state}  # fmt: skip


def _target_gone(row: dict) -> str | None:
    if row["kind"] != "patch":
        return None
    for path in row["targets"]:
        try:
            resolve_path(path)
        except Exception as error:  # a missing module or attribute: the path no longer names anything
            return f"{path}: {error}"
    return None


def check_workarounds(rows: list[dict], seconds: dict[str, float], versions: dict, github: GitHubClient,
                      rerun_without, per_workaround: int = 2, budget_seconds: float | None = None,
                      clock=time.monotonic) -> list[WorkaroundFinding]:  # fmt: skip
    """Judge each ledger row (``harness.ledger.ledger_rows``). ``rerun_without(row, cells) -> {cell: record}`` re-runs
    cells without that workaround; ``seconds`` is each cell's cost in the run, to pick and order the cheapest."""
    findings, checks = [], []
    for row in rows:
        finding = WorkaroundFinding(row["name"], row["backend"], row["kind"], upstream=row.get("upstream"))
        findings.append(finding)
        fired = row.get("fired", [])
        finding.sweep_after = sorted({parse_cell_id(cell)[0] for cell in fired})
        if row.get("fixed_when"):
            reached = condition_holds(row["fixed_when"], versions)
            finding.evidence.append(f"version {'reached' if reached else 'not reached'}: {row['fixed_when']}")
        if row.get("upstream"):
            answer = github.state(row["upstream"])
            finding.upstream_state = answer["state"]
            finding.evidence.append(f"upstream {row['upstream']}: {answer['state']}")
        gone = _target_gone(row)
        if gone:
            finding.verdict = "target gone"
            finding.evidence.append(f"target gone: {gone}")
        elif row["kind"] == "backend_preparation":
            finding.verdict = "backend setup: not checked"
        elif row["kind"] == "unlisted":
            finding.verdict = "gone from the code since that run"
        elif row["kind"] == "switch":
            finding.verdict = "not checked (it cannot be turned off)" if fired else "never fires"
        elif not fired:
            finding.verdict = "never fires"
        else:
            passing = [cell for cell in fired if cell not in set(row.get("failing", []))] or fired
            cells = sorted(passing, key=lambda cell: (seconds.get(cell, float("inf")), cell))[:per_workaround]
            checks.append((sum(seconds.get(cell, 0.0) for cell in cells), finding, row, cells))
    started = clock()
    for _cost, finding, row, cells in sorted(checks, key=lambda check: (check[0], check[1].name)):
        if budget_seconds is not None and clock() - started > budget_seconds:
            finding.evidence.append("not re-run: the time budget was spent")
            continue
        finding.tried = cells
        records = rerun_without(row, cells)
        failed = [record for record in records.values() if record.status != "pass"]
        for record in records.values():
            finding.evidence.append(f"without it, {record.cell_id}: {record.status} at {record.stage}"
                                    + (f" ({record.error_signature})" if record.error_signature else ""))  # fmt: skip
        if failed:
            finding.verdict = "still needed"
        elif records:
            finding.verdict = "not needed on the cells tried"
    for finding in findings:
        if finding.verdict in FINAL:
            continue
        if any(item.startswith("version reached") for item in finding.evidence):
            finding.verdict = "version reached"
        elif finding.upstream_state and is_fixed(finding.upstream_state):
            finding.verdict = "upstream closed"
    return findings


def rerun_without_workaround(out: Path, jobs: int, timeout: float, registry=None):
    """A ``rerun_without`` for ``check_workarounds``: the cells in a run folder of their own per workaround
    (``out/<backend>-<name>``), run with that workaround turned off."""
    from harness.store import RunStore
    from harness.sweep import Progress, run_cells
    from harness.workers import WorkerOptions

    def rerun(row: dict, cells: list[str]) -> dict:
        store = RunStore(Path(out) / f"{row['backend']}-{row['name']}")
        store.create({"purpose": "workaround stale check", "disabled_workarounds": [row["name"]]}, resume=True)
        options = WorkerOptions(timeout=timeout, log_dir=store.logs_dir,
                                disabled_workarounds=(row["name"],))  # fmt: skip
        records = run_cells(cells, store, options, jobs, registry, Progress(len(cells), every=60))
        store.finish()
        return records

    return rerun


def print_findings(findings: list[WorkaroundFinding], stream) -> None:
    rows = [("backend", "workaround", "verdict", "evidence")]
    rows += [(f.backend, f.name, f.verdict, (f.evidence[-1] if f.evidence else "")[:100]) for f in findings]
    widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
    for number, row in enumerate(rows):
        stream.write("  ".join(str(cell).ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3] + "\n")
        if number == 0:
            stream.write("  ".join("-" * width for width in widths) + "  --------\n")
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.verdict] = counts.get(finding.verdict, 0) + 1
    stream.write(f"{len(findings)} workarounds: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())) + "\n")
