"""The sweep under pytest, run for real: with a baseline its exit status says whether something got worse, and
pytest's own conventions hold (--lf, --collect-only, the cells of a class on one worker).

A real failure is made by running without a workaround the class needs (Longformer's dense attention patch: without
it torch.export stops on a data-dependent guard)."""

import os
import subprocess
import sys
from pathlib import Path

from harness.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
CLASSES = "LongformerForMaskedLM,BertModel"
BREAK = "--disable-workarounds=_patch_longformer_attention_dense"
LONGFORMER = "test_cell[LongformerForMaskedLM-dynamo-static]"


def sweep(tmp_path, out, *args):
    command = [sys.executable, "-m", "pytest", "-n", "0", "-rxXf", f"--sweep={CLASSES}", "--backends=dynamo",
               "--shapes=static", f"--sweep-out={tmp_path / out}", "-o", f"cache_dir={tmp_path / 'pytest-cache'}", *args]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "EXPORT_SWEEP_CACHE": str(tmp_path / "cache")})  # fmt: skip


def test_with_a_baseline_the_exit_status_says_whether_something_got_worse(tmp_path):
    good = sweep(tmp_path, "good")
    assert good.returncode == 0, good.stdout[-3000:]

    regressed = sweep(tmp_path, "regressed", BREAK, f"--sweep-baseline={tmp_path / 'good'}")
    assert regressed.returncode == 1, regressed.stdout[-3000:]
    assert f"FAILED tests/sweep/test_sweep.py::{LONGFORMER}" in regressed.stdout

    known = sweep(tmp_path, "known", BREAK, f"--sweep-baseline={tmp_path / 'regressed'}")
    assert known.returncode == 0, known.stdout[-3000:]
    assert f"XFAIL tests/sweep/test_sweep.py::{LONGFORMER}" in known.stdout
    assert "fails in the baseline too: torch-export" in known.stdout, "the reason is the baseline's bucket"

    fixed = sweep(tmp_path, "fixed", f"--sweep-baseline={tmp_path / 'regressed'}")
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert f"XPASS tests/sweep/test_sweep.py::{LONGFORMER}" in fixed.stdout


def test_last_failed_runs_only_the_cells_that_failed(tmp_path):
    first = sweep(tmp_path, "first", BREAK)
    assert first.returncode == 1
    store = RunStore(tmp_path / "first")  # the failure shows what its worker wrote
    log = store.cell_log(store.read("LongformerForMaskedLM-dynamo-static"))
    assert log and "Captured stderr call" in first.stdout and log.strip().splitlines()[-1] in first.stdout
    again = sweep(tmp_path, "again", BREAK, "--lf")
    assert "rerun previous 1 failure" in again.stdout and "1 failed" in again.stdout, again.stdout[-2000:]
    assert RunStore(tmp_path / "again").cell_ids() == {"LongformerForMaskedLM-dynamo-static"}
    report = (tmp_path / "again" / "site" / "changes.html").read_text()
    assert "planned cells have no record" not in report, "a cell left out on purpose is not missing"


def test_collect_only_writes_no_run_folder(tmp_path):
    listed = sweep(tmp_path, "listed", "--collect-only", "-q")
    assert listed.returncode == 0, listed.stdout[-2000:]
    assert LONGFORMER in listed.stdout
    assert not (tmp_path / "listed").exists()
