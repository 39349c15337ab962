"""Run folders: whole records only, loadable as a DataFrame, corrupt files named with their line."""

import json

import pytest

from harness import CorruptRecordError, RunStore, load_run
from harness.records import CellRecord, StageRecord, error_signature


def _record(model="BertModel", backend="onnx", shape="static", status="pass", stage="parity"):
    record = CellRecord(model, "bert", "base", backend, shape, tasks=["base"])
    record.stages = [StageRecord("config", "pass", 0.1), StageRecord("build", "pass", 0.2)]
    if status != "pass":
        record.stages.append(StageRecord(stage, status, 0.3, "RuntimeError", "Cannot view a tensor with shape [2, 7]"))
    else:
        record.stages.append(StageRecord("parity", "pass", 0.01))
        record.max_abs_diff = 1e-7
    return record.finish()


def test_records_round_trip_and_load_as_a_frame(tmp_path):
    store = RunStore(tmp_path)
    store.create({"models": "test"})
    store.write(_record())
    store.write(_record(backend="dynamo", status="fail", stage="torch-export"))
    frame = load_run(tmp_path)
    assert len(frame) == 2
    for column in ["model_class", "model_type", "task", "backend", "shape_mode", "status", "stage", "seconds",
                   "max_abs_diff", "error_signature", "input_set"]:  # fmt: skip
        assert column in frame.columns
    failed = frame[frame.backend == "dynamo"].iloc[0]
    assert (failed.status, failed.stage) == ("fail", "torch-export")
    assert failed.error_signature == "torch-export: RuntimeError: Cannot view a tensor with shape [<n>, <n>]"
    assert store.read("BertModel-onnx-static") == _record()


def test_a_second_run_in_the_same_folder_needs_resume(tmp_path):
    store = RunStore(tmp_path)
    store.create({})
    store.write(_record())
    with pytest.raises(FileExistsError, match="already holds 1 cell records: pass --resume"):
        RunStore(tmp_path).create({})
    metadata = RunStore(tmp_path).create({}, resume=True)
    assert [session["resumed"] for session in metadata["sessions"]] == [False, True]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"model_class": "BertModel", "model_type"', r"BertModel-onnx-static.json:1: truncated"),
        ('{\n "model_class": "BertModel",\n oops\n}', r"BertModel-onnx-static.json:3: not valid JSON"),
        ("[1, 2]", r"BertModel-onnx-static.json:1: expected a JSON object"),
        ('{"model_class": "BertModel", "colour": 1}', r"not a cell record \(.*colour"),
    ],
)
def test_a_corrupt_record_is_reported_with_file_and_line(tmp_path, text, expected):
    store = RunStore(tmp_path)
    store.create({})
    store.write(_record(backend="dynamo"))
    (store.cells_dir / "BertModel-onnx-static.json").write_text(text)
    with pytest.raises(CorruptRecordError, match=expected):
        load_run(tmp_path)


def test_a_record_in_the_wrong_file_is_refused(tmp_path):
    store = RunStore(tmp_path)
    store.write(_record())
    (store.cells_dir / "GPT2Model-onnx-static.json").write_text(json.dumps(_record().to_dict()))
    with pytest.raises(CorruptRecordError, match="holds cell 'BertModel-onnx-static'"):
        store.records()


def test_not_a_run_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing: no such folder"):
        load_run(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        load_run(tmp_path / "empty")


def test_error_signatures_bucket_alike_failures_together():
    first = error_signature("eager", "RuntimeError", "The size of tensor a (16) must match the size of tensor b (49)")
    second = error_signature("eager", "RuntimeError", "The size of tensor a (4) must match the size of tensor b (8)")
    assert first == second
    assert error_signature("run", "X", "[onnx:run] X: boom at /a/b/c.py:12") == "run: X: boom at <file>:<n>"
    guard = "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u12, 0)"
    assert error_signature("torch-export", "GuardOnDataDependentSymNode", guard) == (
        "torch-export: GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(<sym>, <n>)"
    ), "the type is named once"
    assert error_signature("eager", "RuntimeError", "mat1 and mat2 shapes cannot be multiplied (48x64 and 2048x8)") == (
        "eager: RuntimeError: mat1 and mat2 shapes cannot be multiplied (<shape> and <shape>)"
    )
    executorch = "method->execute() failed with error 0x12 at 0x7f3a2b1c4d00"
    assert error_signature("run", "RuntimeError", executorch).endswith("error 0x12 at <addr>"), "codes stay apart"


def test_a_failure_is_attributed_to_the_nested_stage_that_raised():
    record = CellRecord("XLNetModel", "xlnet", "base", "onnx", "static")
    record.stages = [StageRecord("torch-export", "pass", 1.0), StageRecord("decompositions", "fail", 0.1),
                     StageRecord("onnx-translation", "fail", 0.2, "RuntimeError", "RuntimeError: no overload")]  # fmt: skip
    record.finish()
    assert (record.status, record.stage, record.error_type) == ("fail", "onnx-translation", "RuntimeError")
