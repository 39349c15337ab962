"""The nightly workflow: valid for GitHub Actions (actionlint and the workflow schema), and its steps (.ci/nightly)
run here: shards of one plan, a lost shard named and its cells missing, the issue opened and closed through `gh`
(a stand-in on PATH that records what it was asked: the real one needs GitHub), and the last 30 nights kept."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import load_run
from harness.plan import SweepPlan

from .test_changes import plan_of, record, write_run

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly-sweep.yml"
NIGHTLY = ROOT / ".ci" / "nightly"
BIN = Path(sys.executable).parent


def nightly(*args, env=None, timeout=900):
    environment = {**os.environ, "STALE_OFFLINE": "1", "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(NIGHTLY), *map(str, args)], env=environment, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_actionlint_passes_on_the_workflow():
    result = subprocess.run([str(BIN / "actionlint"), "-no-color", str(WORKFLOW)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_workflow_validates_against_the_github_workflow_schema():
    result = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_workflow_runs_the_steps_tested_here_with_least_privilege():
    text = WORKFLOW.read_text()
    for step in ("bash .ci/nightly plan plan/plan.json baseline",
                 'bash .ci/nightly shard ${{ matrix.shard }} plan/plan.json "runs/shard-${{ matrix.shard }}" baseline',
                 "bash .ci/nightly merge runs/nightly plan/plan.json baseline shards/*",
                 "bash .ci/nightly notify runs/nightly", "bash .ci/nightly publish runs/nightly/site previous-site",
                 ".venv/bin/python -m pytest -n auto -m nightly"):  # fmt: skip
        assert step in text, step
    assert "SWEEP_MEMORY_CAP_MB: 6000" in text and "SWEEP_JOBS: 2" in text
    top = text.split("\njobs:")[0]
    assert "pages: write" not in top and "id-token: write" not in top, "write permissions only where they are used"
    publish = text.split("\n  publish:")[1]
    assert "pages: write" in publish and "id-token: write" in publish
    assert "issues: write" in text.split("\n  notify:")[1].split("\n  publish:")[0]


def test_a_lost_shard_turns_the_night_red_and_is_named(tmp_path):
    plan = plan_of([f"Model{i}" for i in range(6)], shards=3)
    plan.save(tmp_path / "plan.json")
    baseline = write_run(tmp_path / "baseline", [record(name) for name in plan.class_names()])
    shards = [write_run(tmp_path / f"shard-{i}", [record(n) for n in plan.class_names(i)], plan=plan, shard=i)
              for i in (1, 3)]  # fmt: skip
    (tmp_path / "shard-2").mkdir()  # the artifact of a runner that died: nothing in it
    result = nightly("merge", tmp_path / "nightly", tmp_path / "plan.json", baseline, *shards, tmp_path / "shard-2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "shard 2/3 is missing" in result.stderr
    frame = load_run(tmp_path / "nightly")
    assert len(frame) == 4
    changes = json.loads((tmp_path / "nightly" / "site" / "changes.json").read_text())
    assert changes["counts"]["missing"] == 2
    summary = (tmp_path / "nightly" / "site" / "summary.md").read_text()
    assert "### missing (2)" in summary and "| onnx | static | 4 / 6 | 66.6 | -33.4 |" in summary


def test_the_issue_is_opened_updated_and_closed_through_gh(tmp_path):
    fake = tmp_path / "bin" / "gh"
    fake.parent.mkdir()
    log, state = tmp_path / "gh.log", tmp_path / "open-issue"
    fake.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {log}
if [ "$1 $2" = "issue list" ]; then cat {state} 2>/dev/null; fi
if [ "$1 $2" = "issue create" ]; then echo 7 > {state}; fi
if [ "$1 $2" = "issue close" ]; then rm -f {state}; fi
""")
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}"}
    baseline = write_run(tmp_path / "baseline", [record("ModelA"), record("ModelB")])

    def night(name, records):
        run = write_run(tmp_path / name, records, plan=plan_of(["ModelA", "ModelB"]))
        nightly("merge", tmp_path / f"{name}-merged", run / "plan.json", baseline, run)
        return nightly("notify", tmp_path / f"{name}-merged", env=env)

    red = night("red", [record("ModelA"), record("ModelB", "fail", "torch-export")])
    assert red.returncode == 0, red.stderr
    assert "issue create --title Nightly sweep: 1 regressions (1 regression)" in log.read_text()
    again = night("red-again", [record("ModelA", "fail", "run"), record("ModelB", "fail", "torch-export")])
    assert again.returncode == 0, again.stderr
    assert "issue edit 7 --title Nightly sweep: 2 regressions (2 regression)" in log.read_text()
    clean = night("clean", [record("ModelA"), record("ModelB")])
    assert clean.returncode == 0, clean.stderr
    assert "issue close 7" in log.read_text() and not state.exists()
    assert log.read_text().count("issue create") == 1, "one issue, updated, never a second"


def test_the_site_keeps_the_last_30_nights(tmp_path):
    previous = tmp_path / "previous"
    earlier = [f"2026-11-{day:02d}" for day in range(1, 31)] + [f"2026-12-{day:02d}" for day in range(1, 6)]
    for night in earlier:
        (previous / "nights" / night).mkdir(parents=True)
    run = write_run(tmp_path / "run", [record("ModelA")])
    subprocess.run([sys.executable, "-m", "commands", "report", str(run)], cwd=ROOT, check=True, capture_output=True)
    published = nightly("publish", run / "site", previous)
    assert published.returncode == 0, published.stderr
    nights = sorted(path.name for path in (run / "site" / "nights").iterdir() if path.is_dir())
    tonight = json.loads((run / "run.json").read_text())["started_at"][:10]
    assert len(nights) == 30 and tonight in nights and "2026-12-05" in nights and "2026-11-06" not in nights
    assert (run / "site" / "nights" / tonight / "index.html").is_file()


def test_shards_of_one_plan_cover_the_sweep_and_merge_into_one_run(tmp_path):
    env = {"SWEEP_MODELS": "BertModel,GPT2Model,ViTModel", "SWEEP_BACKENDS": "dynamo", "SWEEP_SHAPES": "static",
           "SHARDS": "2", "EXPORT_SWEEP_CACHE": str(tmp_path / "cache")}  # fmt: skip
    planned = nightly("plan", tmp_path / "plan.json", tmp_path / "no-baseline", env=env)
    assert planned.returncode == 0, planned.stderr
    assert "no baseline run" in planned.stderr, "a missing baseline is said, not ignored"
    plan = SweepPlan.load(tmp_path / "plan.json")
    for index in (1, 2):
        shard = nightly("shard", index, tmp_path / "plan.json", tmp_path / f"shard-{index}", env=env)
        assert shard.returncode == 0, shard.stdout[-3000:] + shard.stderr[-3000:]
    merged = nightly("merge", tmp_path / "nightly", tmp_path / "plan.json", tmp_path / "no-baseline",
                     tmp_path / "shard-1", tmp_path / "shard-2", env=env)  # fmt: skip
    assert merged.returncode == 0, merged.stdout[-3000:] + merged.stderr[-3000:]
    frame = load_run(tmp_path / "nightly")
    assert sorted(frame.cell_id) == sorted(plan.cells())
    assert (tmp_path / "nightly" / "site" / "index.html").is_file()
    assert json.loads((tmp_path / "nightly" / "stale.json").read_text())["offline"] is True
