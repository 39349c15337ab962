"""The export-sweep command line, run for real in subprocesses: run, resume after a kill, show, merge, and the
pytest driver writing one run folder from several xdist workers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import load_run
from harness.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
CLASSES = "BertModel,GPT2Model,ViTModel"


def export_sweep(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "commands", *args], cwd=ROOT, capture_output=True, text=True, **kwargs
    )


def test_resume_after_a_kill_loses_no_finished_cell(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "commands", "run", "--models", CLASSES, "--backends", "dynamo",
               "--shapes", "static,dynamic", "--jobs", "1", "--out", str(out), "--no-cache", "--no-report"]  # fmt: skip
    sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(RunStore(out).cell_ids()) < 2:
        time.sleep(0.2)
    os.killpg(sweep.pid, signal.SIGKILL)  # the whole sweep, workers included, dies at once
    sweep.wait()
    finished = {path.name: path.read_bytes() for path in (out / "cells").glob("*.json")}
    assert 2 <= len(finished) < 6

    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "pass --resume" in refused.stderr

    resumed = subprocess.run([*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"({len(finished)} already done" in resumed.stderr
    after = {path.name: path.read_bytes() for path in (out / "cells").glob("*.json")}
    assert len(after) == 6
    assert all(after[name] == content for name, content in finished.items()), "finished cells were not re-run"
    assert not list((out / "cells").glob(".*.tmp")), "no partial record left behind"
    sessions = json.loads((out / "run.json").read_text())["sessions"]
    assert [session["resumed"] for session in sessions] == [False, True]


def test_show_prints_the_stages_and_a_repro_command(tmp_path):
    out = tmp_path / "run"
    ran = export_sweep("run", "--models", "BertModel", "--backends", "onnx", "--shapes", "static", "--out", str(out),
                       "--no-cache", "--no-report", timeout=600)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    shown = export_sweep("show", str(out), "BertModel-onnx-static", timeout=60)
    assert shown.returncode == 0
    assert "BertModel-onnx-static: pass at parity" in shown.stdout
    for stage in ("config", "build", "eager", "torch-export", "onnx-translation", "load", "run", "parity"):
        assert f"] {stage}" in shown.stdout
    assert "repro: export-sweep run --models BertModel --backends onnx --shapes static --no-cache" in shown.stdout
    missing = export_sweep("show", str(out), "BertModel-onnx-dynamc", timeout=60)
    assert missing.returncode == 2 and "no cell 'BertModel-onnx-dynamc'" in missing.stderr


def test_show_prints_a_generation_cell(tmp_path):
    out = tmp_path / "run"
    ran = export_sweep("run", "--models", "LlamaForCausalLM", "--backends", "dynamo", "--shapes", "generate",
                       "--out", str(out), "--no-cache", "--no-report", timeout=600)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    shown = export_sweep("show", str(out), "LlamaForCausalLM-dynamo-generate", timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "LlamaForCausalLM-dynamo-generate: pass at parity" in shown.stdout
    assert "parity: max abs" in shown.stdout and "max rel" not in shown.stdout


def test_shards_merge_into_one_run(tmp_path):
    runs = []
    for index in (1, 2):
        out = tmp_path / f"shard{index}"
        ran = export_sweep("run", "--models", CLASSES, "--backends", "dynamo", "--shapes", "static",
                           "--shard", f"{index}/2", "--out", str(out), "--no-cache", "--no-report", timeout=600)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        runs.append(out)
    assert sum(len(RunStore(run).cell_ids()) for run in runs) == 3
    merged = export_sweep("merge", str(tmp_path / "merged"), *map(str, runs), timeout=60)
    assert merged.returncode == 0, merged.stderr
    frame = load_run(tmp_path / "merged")
    assert sorted(frame.model_class) == sorted(CLASSES.split(","))
    assert len(json.loads((tmp_path / "merged" / "run.json").read_text())["shards"]) == 2
    again = export_sweep("merge", str(tmp_path / "merged"), *map(str, runs), timeout=60)
    assert again.returncode == 2 and "merge into a new or empty folder" in again.stderr


def test_pytest_drives_the_sweep_with_one_item_per_cell(tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--sweep=BertModel,GPT2Model",
         "--backends=dynamo", "--shapes=static,dynamic", f"--sweep-out={out}", "-v"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "EXPORT_SWEEP_CACHE": str(cache)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "INTERNALERROR" not in result.stdout + result.stderr
    assert len(list((cache / "results").rglob("*.json"))) == 4, "the session's cells are cached for the next"
    for cell in ("BertModel-dynamo-static", "BertModel-dynamo-dynamic", "GPT2Model-dynamo-static"):
        assert f"test_cell[{cell}]" in result.stdout
    assert RunStore(out).cell_ids() == {f"{m}-dynamo-{s}" for m in ("BertModel", "GPT2Model") for s in ("static", "dynamic")}
    assert (out / "site" / "index.html").is_file()
    records = RunStore(out).records()
    assert {record.worker for record in records} <= {"gw0", "gw1"}
    for model in ("BertModel", "GPT2Model"):  # loadgroup, not worksteal: a class is built once, on one worker
        assert len({record.worker for record in records if record.model_class == model}) == 1


def test_the_console_shows_the_sweep_and_the_log_keeps_the_library_noise(tmp_path):
    out = tmp_path / "run"
    ran = export_sweep("run", "--models", "BertModel", "--backends", "onnx", "--shapes", "static", "--out", str(out),
                       "--no-cache", "--no-report", timeout=600)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    noise = ("torchao", "Failed to load", "_pytree.py", "FutureWarning", "Skipping torchvision")
    assert not [line for line in ran.stderr.splitlines() if any(word in line for word in noise)], ran.stderr
    assert "cells: pass 1" in ran.stderr
    assert "torchao" in (out / "logs" / "sweep.log").read_text(), "the noise is kept, in the run's log"
    version = export_sweep("--version", timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("export-sweep ")


def test_the_eta_weighs_what_is_left_by_the_baseline_costs():
    from harness.records import CellRecord
    from harness.sweep import Progress

    class Sink:
        def write(self, text):
            pass

        def flush(self):
            pass

        def isatty(self):
            return False

    progress = Progress(3, stream=Sink(), estimates={"A-onnx-static": 1.0, "B-onnx-static": 1.0, "C-onnx-static": 98.0},
                        pending=["A-onnx-static", "B-onnx-static", "C-onnx-static"])  # fmt: skip
    progress.add(CellRecord("A", "a", "base", "onnx", "static"))
    progress.add(CellRecord("B", "b", "base", "onnx", "static"))
    # two cheap cells took 2 s: the heavy one left is 98 baseline seconds, not one cell's average
    assert progress.eta(2.0) == 98.0
    assert Progress(3, stream=Sink()).eta(2.0) is None
