"""The dashboard renders real and synthetic runs: every page, summary.md and junit.xml, escaped and complete."""

import time
import xml.etree.ElementTree as ElementTree

import pytest

from harness.store import RunStore
from reports import write_report

from .conftest import synthetic_record, synthetic_run

PAGES = ["index.html", "changes.html", "matrix.html", "failures.html", "parity.html", "registry.html", "workarounds.html",
         "history.html"]


def test_a_real_run_renders_every_page(real_run):
    site = write_report(real_run)
    for page in PAGES:
        assert (site / page).stat().st_size > 500, page
    records = RunStore(real_run).records()
    assert len(records) == 4
    failing = [r for r in records if r.status != "pass"]
    assert [r.cell_id for r in failing] == ["GPT2Model-onnx-static"]
    assert failing[0].stage == "torch-export"
    cell_page = (site / "cells" / "GPT2Model-onnx-static.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in cell_page and "<script>alert(1)" not in cell_page
    assert "export-sweep run --models GPT2Model --backends onnx --shapes static --no-cache" in cell_page
    assert "torch-export" in (site / "failures.html").read_text()
    # the failing cell's part of its worker's log, and only it; a passing cell shows none
    assert "Worker log" in cell_page and "layer norm of &lt;32&gt; refused" in cell_page and "==&gt;" not in cell_page
    assert "Worker log" not in (site / "cells" / "GPT2Model-dynamo-static.html").read_text()
    summary = (site / "summary.md").read_text()
    assert "| onnx | static | 1 / 2 | 50.0 |" in summary and "| dynamo | static | 2 / 2 | 100.0 |" in summary


def test_junit_has_one_testcase_per_cell(real_run):
    site = write_report(real_run)
    suite = ElementTree.parse(site / "junit.xml").getroot()
    cases = suite.findall("testcase")
    assert len(cases) == 4 and suite.get("failures") == "1"
    failed = [case for case in cases if case.find("failure") is not None]
    # named as pytest names the sweep's items, so the two JUnit files of a night speak of the same cells
    assert [(case.get("classname"), case.get("name")) for case in failed] == [
        ("tests.sweep.test_sweep", "test_cell[GPT2Model-onnx-static]")
    ]
    assert "layer norm of <32> refused" in failed[0].find("system-err").text  # its part of the worker's log


def test_an_empty_run_renders(tmp_path):
    RunStore(tmp_path).create({"models": "none"})
    site = write_report(tmp_path)
    assert "This run has no cells yet." in (site / "index.html").read_text()
    assert "none" in (site / "summary.md").read_text()


def test_an_all_failing_run_renders(tmp_path):
    synthetic_run(tmp_path, 60, failing=1.0)
    site = write_report(tmp_path)
    overview = (site / "index.html").read_text()
    assert "0.0%" in overview and "Largest failure buckets" in overview


def test_an_overflowing_or_undefined_difference_renders(tmp_path):
    store = RunStore(tmp_path)
    store.create({"models": "two"})
    store.write(synthetic_record("DeepseekV4ForCausalLM", "executorch", status="fail", max_abs=float("inf")))
    store.write(synthetic_record("BertModel", "executorch", status="fail", max_abs=float("nan")))
    store.finish()
    parity_page = (write_report(tmp_path) / "parity.html").read_text()
    assert "DeepseekV4ForCausalLM" in parity_page and "BertModel" in parity_page


def test_hostile_text_and_huge_tracebacks_are_escaped_and_clipped(tmp_path):
    store = RunStore(tmp_path)
    store.create({})
    nasty = "</pre><script>document.title='pwned'</script>\x00\x1b[31m ünïcödé ✓ & \"quotes\" {{ jinja }} ]]>"
    huge = "Traceback:\n" + ("  File 'x.py', line 1, in f\n" * 40000) + nasty
    store.write(synthetic_record("HostileModel", status="fail", stage="torch-export", message=nasty, traceback=huge))
    site = write_report(tmp_path)
    page = (site / "cells" / "HostileModel-onnx-static.html").read_text()
    assert "<script>document.title" not in page and "&lt;script&gt;document.title" in page
    assert "characters cut" in page and len(page) < 600_000
    assert "{{ jinja }}" in page, "template syntax in data is shown, not evaluated"
    ElementTree.parse(site / "junit.xml")  # control characters do not break the XML
    for name in PAGES:
        assert "<script>document.title" not in (site / name).read_text()


def test_regressions_and_new_passes_against_a_baseline(tmp_path):
    before, after = RunStore(tmp_path / "before"), RunStore(tmp_path / "after")
    for store in (before, after):
        store.create({})
    before.write(synthetic_record("StableModel"))
    after.write(synthetic_record("StableModel"))
    before.write(synthetic_record("BrokenModel"))
    after.write(synthetic_record("BrokenModel", status="fail", stage="onnx-translation", message="new bug"))
    before.write(synthetic_record("FixedModel", status="fail", stage="eager", message="old bug"))
    after.write(synthetic_record("FixedModel"))
    site = write_report(tmp_path / "after", baseline=tmp_path / "before")
    overview = (site / "index.html").read_text()
    assert "Regressions (1)" in overview and "BrokenModel-onnx-static" in overview
    assert 'href="changes.html#fixed">fixed 1</a>' in overview
    changes = (site / "changes.html").read_text()
    fixed = changes[changes.index('id="fixed"'):changes.index('id="new-pass"')]
    assert "FixedModel-onnx-static" in fixed and "fail at eager → pass" in fixed
    summary = (site / "summary.md").read_text()
    assert summary.index("## Changes against") < summary.index("| backend |"), "the changes lead"
    assert "- `BrokenModel-onnx-static`: pass → fail at onnx-translation" in summary


def test_history_charts_pass_rates_and_flips(tmp_path):
    runs = tmp_path / "runs"
    for day, status in enumerate(["pass", "fail", "pass"]):
        store = RunStore(runs / f"day{day}")
        store.create({})
        metadata = store.metadata()
        metadata["started_at"] = f"2026-11-0{day + 1}T00:00:00+00:00"
        from harness.store import write_json_atomic

        write_json_atomic(store.directory / "run.json", metadata)
        store.write(synthetic_record("FlakyModel", status=status, stage="parity" if status == "pass" else "run",
                                     message=None if status == "pass" else "boom"))  # fmt: skip
    site = write_report(runs / "day2", history=runs)
    page = (site / "history.html").read_text()
    assert "Cells whose status changed (1)" in page and "FlakyModel-onnx-static" in page
    assert page.count("<circle") == 3


def test_two_thousand_cells_render(tmp_path):
    synthetic_run(tmp_path, 2000)
    start = time.perf_counter()
    site = write_report(tmp_path)
    seconds = time.perf_counter() - start
    assert len(list((site / "cells").glob("*.html"))) == 2000
    matrix = (site / "matrix.html").read_text()
    assert matrix.count("<tr data-name=") == 334  # 6 cells per class
    print(f"rendered 2,000 cells in {seconds:.2f} s")  # the benchmark (bench/report.py) is where speed is judged


def test_not_a_run_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        write_report(tmp_path / "missing")


def test_registry_page_shows_entries_and_stale_verdicts(tmp_path):
    import json

    registry = tmp_path / "registry.toml"
    registry.write_text('[[EXPORT_SKIPS]]\nmodel = "BertModel"\nscope = "onnx"\nreason = "because"\n'
                        'url = "https://github.com/pytorch/pytorch/issues/5"\n')  # fmt: skip
    store = RunStore(tmp_path / "run")
    store.create({"registry": str(registry)})
    record = synthetic_record("BertModel", status="skip", stage="eager")
    record.registry = {"list": "EXPORT_SKIPS", "model": "BertModel", "scope": "onnx", "url": "x"}
    store.write(record)
    (tmp_path / "run" / "stale.json").write_text(json.dumps({"checked_at": "now", "entries": [
        {"list": "EXPORT_SKIPS", "model": "BertModel", "scope": "onnx", "verdict": "passes now", "stale": True,
         "evidence": ["passes now: BertModel-onnx-static"]}]}))  # fmt: skip
    page = (write_report(tmp_path / "run") / "registry.html").read_text()
    assert "because" in page and "pytorch/pytorch/issues/5" in page
    assert "passes now" in page and "passes now: BertModel-onnx-static" in page


def test_summary_counts_eager_once_per_class(tmp_path):
    store = RunStore(tmp_path / "run")
    store.create({"models": "synthetic"})
    for backend in ("dynamo", "onnx"):
        store.write(synthetic_record("BrokenModel", backend=backend, status="fail", stage="eager"))
        store.write(synthetic_record("ExportFailsModel", backend=backend, status="fail", stage="torch-export"))
        store.write(synthetic_record("GoodModel", backend=backend))
    store.write(synthetic_record("SkippedModel", status="skip", stage="config"))
    summary = (write_report(tmp_path / "run") / "summary.md").read_text()
    assert "| eager | classes | 2 / 3 | 66.6 |" in summary, "the eager failure counts once, not per backend"
    assert "| dynamo | static | 1 / 3 | 33.3 |" in summary


def test_a_cell_whose_outputs_hold_inf_or_nan_says_so(tmp_path):
    store = RunStore(tmp_path)
    store.create({})
    record = synthetic_record("MaskedModel")
    record.parity = {"scores": {"ok": True, "abs": 0.0, "rel": 0.0, "shape": [2, 7], "elements": 14, "nonfinite": 3}}
    store.write(record)
    page = (write_report(tmp_path) / "cells" / "MaskedModel-onnx-static.html").read_text()
    assert "Outputs hold inf or NaN (3 elements)" in page and "<td>14</td>" in page


def test_pass_rates_by_modality_and_task(tmp_path):
    store = RunStore(tmp_path)
    store.create({})
    for name, inputs, status in [("TextModel", "text", "pass"), ("VlmModel", "text+image", "fail"),
                                 ("VitModel", "image", "pass"), ("OtherVlmModel", "text+image", "pass")]:  # fmt: skip
        record = synthetic_record(name, status=status, stage="parity" if status == "pass" else "torch-export")
        record.input_set = inputs
        store.write(record)
    overview = (write_report(tmp_path) / "index.html").read_text()
    table = overview[overview.index("Pass rates by modality and task"):overview.index("How far cells got")]
    multimodal = table[table.index(">multimodal<"):].split("</tr>")[0]
    assert "50.0%" in multimodal and "1/2" in multimodal
    assert ">vision<" in table and ">causal-lm<" in table


def test_half_precision_cells_get_columns_and_tiles_of_their_own(tmp_path):
    store = RunStore(tmp_path)
    store.create({"models": "synthetic", "backends": ["onnx"], "shapes": ["static"], "dtypes": ["float32", "bfloat16"]})
    store.write(synthetic_record("Model0ForCausalLM"))
    half = synthetic_record("Model0ForCausalLM", status="unavailable", stage="load", message="no bfloat16 kernel for Add")
    half.dtype = "bfloat16"
    store.write(half)
    store.write(synthetic_record("Model1ForCausalLM"))
    store.finish()
    site = write_report(tmp_path)
    summary = (site / "summary.md").read_text()
    assert "| onnx | static | 2 / 2 | 100.0 |" in summary and "| onnx | static-bfloat16 | 0 / 1 | 0.0 |" in summary
    matrix = (site / "matrix.html").read_text()
    assert matrix.count("<small>static-bfloat16</small>") == 1 and matrix.count("<small>static</small>") == 1
    assert "onnx · static · bfloat16" in (site / "cells" / "Model0ForCausalLM-onnx-static-bfloat16.html").read_text()


def test_the_summary_counts_half_precision_against_what_passes_in_float32(tmp_path):
    store = RunStore(tmp_path)
    store.create({"models": "synthetic", "backends": ["executorch"], "shapes": ["static"], "dtypes": ["float32", "float16"]})
    outcomes = {  # class: (float32, float16)
        "Model0ForCausalLM": ("pass", "pass"),
        "Model1ForCausalLM": ("pass", "fail"),  # a mismatch at half tolerance
        "Model2ForCausalLM": ("pass", "unavailable"),  # the runtime has no half kernel
        "Model3ForCausalLM": ("fail", "pass"),  # not passing in float32: outside the share
    }
    for name, statuses in outcomes.items():
        for dtype, status in zip(("float32", "float16"), statuses):
            record = synthetic_record(name, backend="executorch", status=status,
                                      stage="parity" if status != "unavailable" else "load")
            record.dtype = dtype
            store.write(record)
    store.finish()
    summary = (write_report(tmp_path) / "summary.md").read_text()
    assert "| executorch | static | float16 | 3 | 1 | 1 | 33.3 | 50.0 |" in summary


def test_the_summary_tells_generate_by_task_counting_a_class_under_each_task_it_generates_for(tmp_path):
    store = RunStore(tmp_path)
    store.create({"models": "synthetic", "backends": ["dynamo", "executorch"], "shapes": ["static", "generate"]})
    classes = {  # class: (tasks, dynamo generate, executorch generate)
        "LmForCausalLM": (["causal-lm"], "pass", "pass"),
        "VlmForConditionalGeneration": (["image-text-to-text", "multimodal-lm"], "pass", "fail"),
        "OtherVlmForConditionalGeneration": (["causal-lm", "image-text-to-text"], "pass", "pass"),
        "ThirdVlmForConditionalGeneration": (["image-text-to-text"], "pass", "pass"),
    }
    for name, (tasks, *statuses) in classes.items():
        store.write(synthetic_record(name, backend="dynamo"))  # a single forward: not in the table
        for backend, status in zip(("dynamo", "executorch"), statuses):
            record = synthetic_record(name, backend=backend, shape="generate", status=status)
            record.task, record.tasks = tasks[0], tasks
            store.write(record)
    store.finish()
    site = write_report(tmp_path)
    summary = (site / "summary.md").read_text()
    table = summary[summary.index("## Generate, by task"):summary.index("## Cost")]
    assert "| task | dynamo-generate | executorch-generate |" in table
    assert "| causal-lm | 2 / 2 (100.0 %) | 2 / 2 (100.0 %) |" in table
    assert "| image-text-to-text | 3 / 3 (100.0 %) | 2 / 3 (66.6 %) |" in table
    assert "multimodal-lm" not in table  # a task of the class, not one it generates for
    overview = (site / "index.html").read_text()
    row = overview[overview.index(">image-text-to-text<"):].split("</tr>")[0]
    assert "66.6%" in row and "66.7%" not in row, "the overview rounds a pass rate as the summary does"


def test_the_summary_and_overview_say_what_the_run_cost(tmp_path):
    store = RunStore(tmp_path)
    store.create({"models": "synthetic", "backends": ["executorch"], "shapes": ["static", "dynamic"]})
    cells = [  # (class, shape mode, seconds, worker peak MB, reused from an earlier run)
        ("SmallModel", "static", 1800.0, 300.0, False), ("SmallModel", "dynamic", 3600.0, 900.0, False),
        ("LargeModel", "static", 600.0, 1200.0, False), ("LargeModel", "dynamic", 5400.0, 5000.0, False),
        ("CachedModel", "dynamic", 9999.0, 9999.0, True),  # cost this run nothing: left out
    ]  # fmt: skip
    for name, shape, seconds, peak, reused in cells:
        record = synthetic_record(name, backend="executorch", shape=shape)
        record.seconds, record.peak_rss_mb, record.reused = seconds, peak, reused
        store.write(record)
    store.finish()
    site = write_report(tmp_path)
    summary = (site / "summary.md").read_text()
    assert "3.2 cell-hours for the cells this run ran; static and dynamic 3.2." in summary
    assert "Cells whose worker went above 4,096 MB: 1." in summary
    assert "| executorch | static | 2 | 0.67 | 20m00s |" in summary and "| 1,200 MB |" in summary
    assert "| executorch | dynamic | 2 | 2.50 | 1h15m |" in summary and "| 5,000 MB |" in summary
    assert "- `LargeModel-executorch-dynamic`: 5,000 MB" in summary and "CachedModel" not in summary.split("## Cost")[1]
    overview = (site / "index.html").read_text()
    assert '<a href="cells/LargeModel-executorch-dynamic.html">LargeModel-executorch-dynamic</a> (5000 MB)' in overview
