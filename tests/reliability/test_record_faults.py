"""Records and run folders damaged or crafted: each problem is named with its file and field; the dashboard renders
every record it can and lists the ones it cannot; no page runs a script from a record."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.records import CellRecord, StageRecord
from harness.store import CorruptRecordError, RunStore

ROOT = Path(__file__).resolve().parents[2]


def good_record(model="BertModel", status="pass", message=None) -> CellRecord:
    record = CellRecord(model, "bert", "base", "onnx", "static", tasks=["base"])
    record.stages = [StageRecord("config", "pass", 0.1), StageRecord("parity", status, 0.1, message and "RuntimeError",
                                                                     message)]  # fmt: skip
    record.max_abs_diff = 1e-7
    return record.finish()


def run_with(tmp_path, data: dict | None = None, raw: bytes | None = None, name="BertModel-onnx-static"):
    store = RunStore(tmp_path / "run")
    store.create({"models": "test"})
    store.write(good_record("GPT2Model"))
    path = store.cells_dir / f"{name}.json"
    path.write_bytes(raw if raw is not None else json.dumps(data).encode())
    return store, path


def report(run_dir, *args):
    return subprocess.run([sys.executable, "-m", "commands", "report", str(run_dir), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    "field, value",
    [("status", 123), ("status", "passed"), ("max_abs_diff", "big"), ("tasks", 5), ("parity", [1, 2]),
     ("registry", "x"), ("seconds", "abc"), ("stages", {"a": 1}), ("reused", "yes"), ("backend", "tflite")],
)  # fmt: skip
def test_a_field_of_the_wrong_type_is_named_with_its_file(tmp_path, field, value):
    store, path = run_with(tmp_path, {**good_record().to_dict(), field: value})
    with pytest.raises(CorruptRecordError, match=rf"{path.name}.*'{field}'"):
        store.records()
    site_result = report(store.directory)
    assert site_result.returncode == 0, site_result.stderr  # the rest renders...
    overview = (store.directory / "site" / "index.html").read_text()
    assert "1 files could not be read" in overview and path.name in overview  # ...and the bad file is listed
    assert (store.directory / "site" / "cells" / "GPT2Model-onnx-static.html").is_file()


def test_a_record_without_its_verdict_is_not_a_pass(tmp_path):
    data = good_record().to_dict()
    for field in ("status", "stages", "seconds"):
        del data[field]
    store, path = run_with(tmp_path, data)
    with pytest.raises(CorruptRecordError, match="missing record fields: status, stages, seconds"):
        store.records()


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    store, path = run_with(tmp_path, raw=b'{"model_class": "Bert\xff\xfe"}')
    with pytest.raises(CorruptRecordError, match=rf"{path.name}: not UTF-8 text \(byte 0xff"):
        store.records()


def test_a_lone_surrogate_in_a_message_renders(tmp_path):
    store, _path = run_with(tmp_path, good_record(status="fail", message="bad bytes \ud800 here").to_dict())
    result = report(store.directory)
    assert result.returncode == 0, result.stderr
    page = (store.directory / "site" / "cells" / "BertModel-onnx-static.html").read_text()
    assert "bad bytes ? here" in page


def test_a_run_json_of_the_wrong_types_is_named_and_the_cells_still_render(tmp_path):
    store = RunStore(tmp_path / "run")
    store.create({})
    store.write(good_record())
    (store.directory / "run.json").write_text(json.dumps({"options": "all", "versions": [1], "sessions": 3}))
    result = report(store.directory)
    assert result.returncode == 0, result.stderr
    overview = (store.directory / "site" / "index.html").read_text()
    assert "run.json: field &#39;options&#39; must be dict" in overview
    assert (store.directory / "site" / "cells" / "BertModel-onnx-static.html").is_file()


def test_one_corrupt_record_among_many_leaves_the_rest_on_the_dashboard(tmp_path):
    store = RunStore(tmp_path / "run")
    store.create({})
    for index in range(185):
        store.write(good_record(f"Model{index:03d}"))
    (store.cells_dir / "Broken-onnx-static.json").write_text('{"model_class": "Bro')
    result = report(store.directory)
    assert result.returncode == 0, result.stderr
    assert len(list((store.directory / "site" / "cells").glob("*.html"))) == 185
    assert "Broken-onnx-static.json:1: truncated" in (store.directory / "site" / "index.html").read_text()
    assert "Broken-onnx-static.json" in (store.directory / "site" / "summary.md").read_text()


def test_a_crafted_registry_link_is_text_not_a_script(tmp_path):
    record = good_record(status="fail", message="skipped")
    record.registry = {"list": "EXPORT_SKIPS", "model": "BertModel", "scope": "onnx", "reason": "r",
                       "url": "javascript:alert(document.domain)"}  # fmt: skip
    store, _path = run_with(tmp_path, record.to_dict())
    assert report(store.directory).returncode == 0
    page = (store.directory / "site" / "cells" / "BertModel-onnx-static.html").read_text()
    assert 'href="javascript:' not in page and "javascript:alert(document.domain)" in page


def test_summary_markdown_keeps_record_text_as_text(tmp_path):
    nasty = "<script>alert(1)</script> <img src=x onerror=alert(2)> `code` break-out | table [link](http://x)"
    store, _path = run_with(tmp_path, good_record(status="fail", message=nasty).to_dict())
    assert report(store.directory).returncode == 0
    summary = (store.directory / "site" / "summary.md").read_text()
    bucket = next(line for line in summary.splitlines() if "alert" in line)
    # the message sits whole inside one code span, fenced by more backticks than it holds: Markdown shows it as text
    span = re.fullmatch(r"\d+\. \d+ cells, (`+) (.*) \1", bucket)
    assert span and len(span.group(1)) == 2 and "`code`" in span.group(2), bucket
    outside = summary.replace(bucket, "")
    assert "<script>" not in outside and "<img" not in outside
