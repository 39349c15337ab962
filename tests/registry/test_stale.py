"""The stale check on real cells: an entry for a class that exports fine is flagged "passes now", and --fix
removes exactly that entry, keeping the other entries and the comments."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STILL_NEEDED = """
# TimmWrapperModel needs timm, which cannot load here: this entry stays.
[[EXPORT_SKIPS]]
model = "TimmWrapperModel"
scope = "dynamo.static"
reason = "timm needs torchvision"
url = "https://github.com/pytorch/vision/issues/8000"
"""
STALE = """
# Deliberately stale: BertModel exports fine.
[[EXPORT_SKIPS]]
model = "BertModel"
scope = "dynamo.static"
reason = "pretend it does not export"
url = "https://github.com/huggingface/transformers/issues/1"
fixed_when = "torch>=2.0"
"""
HEADER = "# a registry for the stale test\n"


def test_a_stale_entry_is_flagged_and_fix_removes_only_it(tmp_path):
    path = tmp_path / "registry.toml"
    path.write_text(HEADER + STILL_NEEDED + STALE)
    findings_file = tmp_path / "stale.json"
    command = [sys.executable, "-m", "commands", "stale", "--registry", str(path), "--offline", "--jobs", "1",
               "--out", str(tmp_path / "rerun"), "--json", str(findings_file)]  # fmt: skip
    result = subprocess.run([*command, "--strict"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 1, result.stderr[-2000:]
    findings = {f["model"]: f for f in json.loads(findings_file.read_text())["entries"]}
    bert, timm = findings["BertModel"], findings["TimmWrapperModel"]
    assert (bert["verdict"], bert["stale"], bert["passes_now"]) == ("passes now", True, True)
    assert any(item.startswith("passes now: BertModel-dynamo-static: pass at parity") for item in bert["evidence"])
    assert "version reached: torch>=2.0 holds for the installed versions" in bert["evidence"]
    assert "upstream https://github.com/huggingface/transformers/issues/1: unknown (offline)" in bert["evidence"]
    assert (timm["verdict"], timm["stale"], timm["passes_now"]) == ("still needed", False, False)
    assert "BertModel" in result.stdout and "passes now" in result.stdout

    fixed = subprocess.run([*command, "--fix"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert path.read_text() == HEADER + STILL_NEEDED
    assert "removed 1 entries that pass now: EXPORT_SKIPS BertModel [dynamo.static]" in fixed.stdout
