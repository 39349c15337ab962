"""Workarounds are known issues too: planted workarounds on a real tiny model, swept for real, then judged by
re-running their cells without each: not needed, still needed (with its failing stage), target gone, never fires,
version reached."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from exporters import registration
from exporters.versions import package_versions
from exporters.workarounds import ledger, load_registrations
from harness.ledger import ledger_rows, read_listing
from harness.models import select
from harness.store import RunStore
from harness.sweep import Plan, Progress, run_sweep
from harness.workers import WorkerOptions
from registry.github import GitHubClient
from registry.workaround_stale import check_workarounds, rerun_without_workaround

ROOT = Path(__file__).resolve().parents[2]
BERT = "transformers.models.bert.modeling_bert"
PLANTED = ("_patch_planted_not_needed", "_patch_planted_break", "_patch_planted_mend", "_patch_planted_released",
           "_patch_planted_gone")  # fmt: skip


@pytest.fixture
def planted():
    """Register the planted Dynamo patches; restore the tables after."""
    load_registrations()
    saved = list(registration.PATCHES["dynamo"])

    @registration.register_patch("dynamo", "transformers.activations.GELUActivation.forward",
                                 model_side="planted: changes nothing")  # fmt: skip
    def _patch_planted_not_needed(original):
        def forward(self, *args, **kwargs):
            return original(self, *args, **kwargs)

        return forward

    @registration.register_patch("dynamo", f"{BERT}.BertSelfOutput.forward", model_side="planted: the breakage")
    def _patch_planted_break(original):
        def forward(self, *args, **kwargs):
            raise RuntimeError("planted breakage: this layer cannot be traced")

        return forward

    @registration.register_patch("dynamo", f"{BERT}.BertSelfOutput.forward", model_side="planted: the mend")
    def _patch_planted_mend(_broken):
        def forward(self, hidden_states, input_tensor):
            return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)

        return forward

    @registration.register_patch("dynamo", f"{BERT}.BertPooler.__init__", model_side="planted",
                                 fixed_when="torch>=2.0")  # fmt: skip
    def _patch_planted_released(original):  # __init__ runs before the export: it never fires
        return original

    try:
        yield
    finally:
        registration.PATCHES["dynamo"][:] = saved


def test_each_verdict_of_a_planted_workaround(planted, tmp_path):
    store = RunStore(tmp_path / "run")
    store.create({"models": "BertModel"})
    plan = Plan(select("BertModel"), ("dynamo",), ("static",))
    run_sweep(plan, store, WorkerOptions(timeout=300), jobs=1, progress=Progress(plan.total, every=60))
    store.finish()
    [record] = store.records()
    assert record.status == "pass", record.message
    assert {"_patch_planted_not_needed", "_patch_planted_mend"} <= set(record.applied)

    @registration.register_patch("dynamo", f"{BERT}.BertNoSuchLayer.forward", model_side="planted: gone")
    def _patch_planted_gone(original):
        return original

    rows = [row for row in ledger_rows(ledger(("dynamo",)), [record]) if row["name"] in PLANTED]
    registration.PATCHES["dynamo"].pop()  # installing it would fail every export: the check reads its path only
    github = GitHubClient(offline=True)
    rerun = rerun_without_workaround(tmp_path / "checks", jobs=1, timeout=300)
    findings = {f.name: f for f in check_workarounds(rows, {record.cell_id: record.seconds}, package_versions(),
                                                     github, rerun, per_workaround=1)}  # fmt: skip
    verdicts = {name: finding.verdict for name, finding in findings.items()}
    assert verdicts == {
        "_patch_planted_not_needed": "not needed on the cells tried",
        "_patch_planted_mend": "still needed",
        "_patch_planted_break": "never fires",
        "_patch_planted_gone": "target gone",
        "_patch_planted_released": "version reached",
    }
    evidence = " ".join(findings["_patch_planted_mend"].evidence)
    assert "BertModel-dynamo-static: fail at torch-export" in evidence and "planted breakage" in evidence
    assert findings["_patch_planted_not_needed"].tried == ["BertModel-dynamo-static"]
    assert findings["_patch_planted_not_needed"].sweep_after == ["BertModel"], "what to sweep once it is removed"
    assert "BertNoSuchLayer" in " ".join(findings["_patch_planted_gone"].evidence)


def test_a_budget_leaves_the_rest_not_checked(planted, tmp_path):
    rows = [row | {"fired": ["BertModel-dynamo-static"], "failing": []} for row in ledger(("dynamo",))
            if row["name"] in ("_patch_planted_not_needed", "_patch_planted_mend")]  # fmt: skip
    ran = []
    ticks = iter([0.0, 0.0, 100.0, 100.0])
    findings = check_workarounds(rows, {"BertModel-dynamo-static": 1.0}, {}, GitHubClient(offline=True),
                                 lambda row, cells: ran.append(row["name"]) or {}, budget_seconds=60,
                                 clock=lambda: next(ticks))  # fmt: skip
    assert len(ran) == 1 and sorted(f.verdict for f in findings) == ["not checked", "not checked"]
    assert any("budget" in item for f in findings for item in f.evidence)


@pytest.mark.parametrize(
    "keywords, message",
    [({}, "says nothing of what would make it unnecessary"),
     ({"upstream": "https://github.com/someone/fork/issues/3"}, "is not an issue or pull request of"),
     ({"upstream": "https://example.com/bug"}, "is not an issue or pull request of"),
     ({"model_side": "   "}, "says nothing"),
     ({"model_side": "x", "fixed_when": "soon"}, "is not a version condition")],
)  # fmt: skip
def test_a_registration_that_says_nothing_of_what_it_waits_for_is_refused(keywords, message):
    with pytest.raises(ValueError, match=message) as refused:

        @registration.register_fx_node_fix("onnx", **keywords)
        def _fix_planted_silent(graph_module, node):
            return False

    assert "_fix_planted_silent" in str(refused.value), "the message names the workaround"
    assert "_fix_planted_silent" not in [fix.__name__ for fix in registration.FX_NODE_FIXES["onnx"]]


def test_every_workaround_says_what_it_waits_for_in_the_ledger(tmp_path):
    listed = subprocess.run([sys.executable, "-m", "commands", "workarounds", "--json"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["workarounds"]
    assert len(rows) >= 180
    silent = [row["name"] for row in rows if not (row["upstream"] or row["model_side"])]
    assert silent == []
    for row in rows:
        if row["upstream"]:
            assert row["upstream"].startswith(tuple(f"https://github.com/{p}/" for p in registration.UPSTREAM_PROJECTS))


def test_a_run_keeps_its_listing_and_the_dashboard_lists_it(tmp_path):
    out = tmp_path / "run"
    ran = subprocess.run([sys.executable, "-m", "commands", "run", "--models", "LongformerForMaskedLM", "--backends",
                          "dynamo", "--shapes", "static", "--out", str(out), "--no-cache"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    listing = read_listing(out)
    assert listing and all(row["backend"] == "dynamo" for row in listing)
    page = (out / "site" / "workarounds.html").read_text()
    record = RunStore(out).read("LongformerForMaskedLM-dynamo-static")
    assert "_patch_longformer_attention_dense" in record.applied
    assert 'id="dynamo-_patch_longformer_attention_dense"' in page
    assert "matrix.html?cells=LongformerForMaskedLM-dynamo-static" in page
    cell = (out / "site" / "cells" / "LongformerForMaskedLM-dynamo-static.html").read_text()
    assert 'href="../workarounds.html#dynamo-_patch_longformer_attention_dense"' in cell
