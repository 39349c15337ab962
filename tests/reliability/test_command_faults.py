"""Bad options and hostile file systems, tried on the real command line: every one ends in one line naming what is
wrong and exit code 2, before anything runs, and nothing already on disk is changed."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def export_sweep(*args, timeout=300, **kwargs):
    return subprocess.run([sys.executable, "-m", "commands", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, **kwargs)  # fmt: skip


def one_line_error(result, *words):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert lines and all(word in lines[-1] for word in words), lines[-1:]


@pytest.mark.parametrize(
    "option, value, named",
    [("--jobs", "0", "--jobs"), ("--jobs", "-3", "--jobs"), ("--timeout", "-5", "--timeout"),
     ("--timeout", "0", "--timeout"), ("--timeout", "inf", "--timeout"), ("--memory-cap", "-1", "--memory-cap"),
     ("--memory-cap", "nan", "--memory-cap"), ("--limit", "-1", "--limit"), ("--limit", "0", "--limit"),
     ("--sample", "0", "--sample"), ("--jobs", "two", "--jobs")],
)  # fmt: skip
def test_a_bad_number_is_refused_before_anything_runs(tmp_path, option, value, named):
    out = tmp_path / "run"
    result = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--out", out, option, value, timeout=60)
    one_line_error(result, named)
    assert not out.exists()


def test_the_stale_check_with_no_worker_stops_at_once(tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text('[[EXPORT_SKIPS]]\nmodel = "BertModel"\nscope = "onnx"\nreason = "r"\n'
                        'url = "https://github.com/pytorch/pytorch/issues/1"\n')  # fmt: skip
    start = time.monotonic()
    result = export_sweep("stale", "--registry", registry, "--offline", "--jobs", "0", timeout=60)
    one_line_error(result, "--jobs")
    assert time.monotonic() - start < 30


def test_an_out_folder_under_a_file_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--out", blocker / "run", timeout=60)
    one_line_error(result, "--out", str(blocker / "run"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
def test_a_read_only_out_folder_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--out", locked / "run", timeout=60)
    one_line_error(result, "--out")


def test_a_read_only_mount_is_named(tmp_path):
    # /proc/1 cannot be written even by root: a folder the sweep cannot write into, wherever it comes from
    result = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--out", "/proc/1/run", timeout=60)
    one_line_error(result, "--out", "/proc/1/run")


def test_a_cache_dir_that_is_a_file_is_refused_before_the_sweep(tmp_path):
    blocker = tmp_path / "cache-file"
    blocker.write_text("x")
    out = tmp_path / "run"
    result = export_sweep("run", "--models", "BertModel", "--backends", "dynamo", "--shapes", "static", "--out", out,
                          "--cache-dir", blocker, timeout=120)  # fmt: skip
    one_line_error(result, "--cache-dir", str(blocker))
    assert not (out / "cells").exists(), "refused before any cell ran"


def test_a_report_into_a_file_is_named(tmp_path):
    from harness.store import RunStore

    RunStore(tmp_path / "run").create({})
    blocker = tmp_path / "site-file"
    blocker.write_text("x")
    one_line_error(export_sweep("report", tmp_path / "run", "-o", blocker, timeout=60), "--out", str(blocker))


@pytest.mark.parametrize("option", ["--baseline", "--history", "--stale"])
def test_a_missing_report_input_is_named_not_ignored(tmp_path, option):
    from harness.store import RunStore

    RunStore(tmp_path / "run").create({})
    one_line_error(export_sweep("report", tmp_path / "run", option, tmp_path / "nowhere", timeout=60), option)


def test_missing_shard_weights_are_named_not_ignored(tmp_path):
    result = export_sweep("run", "--models", "BertModel,GPT2Model", "--shard", "1/2", "--shard-weights",
                          tmp_path / "nowhere", "--list", timeout=120)  # fmt: skip
    one_line_error(result, "--shard-weights", "no such folder")


def test_a_stale_file_of_the_wrong_shape_or_not_json_is_named(tmp_path):
    from harness.store import RunStore

    RunStore(tmp_path / "run").create({})
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"entries": [1, 2]}')
    one_line_error(export_sweep("report", tmp_path / "run", "--stale", wrong, timeout=60), str(wrong), "entries")
    broken = tmp_path / "broken.json"
    broken.write_text('{"entries": [')
    one_line_error(export_sweep("report", tmp_path / "run", "--stale", broken, timeout=60), str(broken))
