"""The nightly workflow: valid for GitHub Actions, and its steps (.ci/nightly) run here with two shards."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import load_run

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly-sweep.yml"


def test_the_workflow_validates_against_the_github_workflow_schema():
    linter = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run([str(linter), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_workflow_runs_the_steps_tested_here():
    text = WORKFLOW.read_text()
    assert 'bash .ci/nightly shard ${{ matrix.shard }} "$SHARDS"' in text
    assert "bash .ci/nightly merge runs/nightly baseline shards/*" in text
    assert "GITHUB_STEP_SUMMARY" in text and "deploy-pages" in text
    assert ".venv/bin/python -m pytest -n auto -m nightly" in text  # the tier the 20-minute test run leaves out


def test_two_shards_merge_into_one_run_with_a_dashboard(tmp_path):
    env = {**os.environ, "SWEEP_MODELS": "BertModel,GPT2Model,ViTModel", "SWEEP_BACKENDS": "dynamo",
           "SWEEP_SHAPES": "static", "STALE_OFFLINE": "1", "EXPORT_SWEEP_CACHE": str(tmp_path / "cache")}  # fmt: skip
    script = ROOT / ".ci" / "nightly"
    for index in (1, 2):
        shard = subprocess.run(["bash", str(script), "shard", str(index), "2", str(tmp_path / f"shard-{index}")],
                               env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
        assert shard.returncode == 0, shard.stdout[-3000:] + shard.stderr[-3000:]
    merged = subprocess.run(
        ["bash", str(script), "merge", str(tmp_path / "nightly"), str(tmp_path / "no-baseline"),
         str(tmp_path / "shard-1"), str(tmp_path / "shard-2"), str(tmp_path / "shard-3")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert merged.returncode == 0, merged.stdout[-3000:] + merged.stderr[-3000:]
    frame = load_run(tmp_path / "nightly")
    assert sorted(frame.model_class) == ["BertModel", "GPT2Model", "ViTModel"]
    assert (tmp_path / "nightly" / "site" / "index.html").is_file()
    assert "| dynamo | static |" in (tmp_path / "nightly" / "site" / "summary.md").read_text()
    stale = json.loads((tmp_path / "nightly" / "stale.json").read_text())
    assert stale["offline"] is True
