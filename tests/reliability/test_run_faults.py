"""Runs interrupted, resumed wrongly and merged from broken shards: a resume or a merge checks everything before it
changes anything, and a sweep killed with -9 takes its worker with it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.store import RunStore
from tests.harness.test_changes import plan_of, record, write_run

ROOT = Path(__file__).resolve().parents[2]


def export_sweep(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "commands", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_resume_over_a_truncated_record_changes_nothing(tmp_path):
    out = tmp_path / "run"
    ran = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--shapes", "static", "--out", out,
                       "--no-cache", "--no-report")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    record = out / "cells" / "BertModel-dynamo-static.json"
    record.write_text(record.read_text()[:100])
    before = (out / "run.json").read_bytes()
    resumed = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--shapes", "static", "--out", out,
                           "--no-cache", "--no-report", "--resume")  # fmt: skip
    assert resumed.returncode == 2 and "BertModel-dynamo-static.json:5: truncated" in resumed.stderr
    assert (out / "run.json").read_bytes() == before, "run.json untouched: still finished, no new session"


def test_resume_with_other_options_is_refused_and_keeps_the_original_ones(tmp_path):
    out = tmp_path / "run"
    ran = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--shapes", "static", "--out", out,
                       "--no-cache", "--no-report")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    before = (out / "run.json").read_bytes()
    other = export_sweep("run", "--models", "GPT2Model", "--backends", "dynamo", "--shapes", "static", "--out", out,
                         "--no-cache", "--no-report", "--resume", timeout=120)  # fmt: skip
    assert other.returncode == 2 and "was started with another selection" in other.stderr, other.stderr
    assert "--models BertModel" in other.stderr, "it says which options the run started with"
    assert (out / "run.json").read_bytes() == before
    assert json.loads(before)["options"]["models"] == "BertModel"


def test_a_merge_with_a_broken_later_shard_leaves_no_half_written_folder(tmp_path):
    plan = plan_of(["ModelA", "ModelB", "ModelC"], shards=3)
    shards = [write_run(tmp_path / f"shard-{i}", [record(n) for n in plan.class_names(i)], plan=plan, shard=i)
              for i in (1, 2, 3)]  # fmt: skip
    (shards[2] / "run.json").unlink()  # a shard with records but no run.json
    out = tmp_path / "merged"
    result = export_sweep("merge", out, *shards, timeout=120)
    assert result.returncode == 2 and "no run.json" in result.stderr, result.stderr
    assert not out.exists() and not list(tmp_path.glob(".merged.*"))
    (shards[2] / "run.json").write_text(json.dumps(RunStore(shards[0]).metadata() | {"plan": {
        "digest": plan.digest, "shard": 3, "shards": 3}}))  # fmt: skip
    again = export_sweep("merge", out, *shards, timeout=120)
    assert again.returncode == 0, again.stderr
    assert len(RunStore(out).cell_ids()) == 3


def _children(pid: int) -> set[int]:
    try:
        return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_sweep_killed_with_minus_9_takes_its_worker_with_it(tmp_path):
    command = [sys.executable, "-m", "commands", "run", "--models", "T5ForConditionalGeneration", "--backends",
               "executorch", "--shapes", "static,dynamic", "--jobs", "1", "--out", str(tmp_path / "run"), "--no-cache",
               "--no-report"]  # fmt: skip
    sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not workers:
            workers = _children(sweep.pid)
            time.sleep(0.2)
        assert workers, "the sweep never started a worker"
        time.sleep(1.0)  # the worker is inside its cell
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers), "the worker outlived the sweep that forked it"
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_deep_in_a_long_stage_dies_with_its_parent(tmp_path):
    """The worker says nothing to its parent while one stage runs (a to_edge of minutes): the kernel must end it."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time\n"
        "from harness.workers import die_with_parent\n"
        "parent = os.getpid()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    die_with_parent(parent)\n"
        "    time.sleep(120)  # a long stage: no message to the parent, no pipe to break\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "time.sleep(120)\n"
    )  # fmt: skip
    parent = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        time.sleep(0.5)
        assert _alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.05)
        assert not _alive(child), "the worker outlived its parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
