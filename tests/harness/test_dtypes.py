"""The dtype axis: a half-precision cell casts the tiny model and its floating inputs, compares against eager in that
dtype with the tolerance of `DTYPE_TOLERANCE` (or, beyond it, against float32 eager within twice eager's own
half-precision error), keeps float32 cells as they were, and calls what a runtime has no kernel for `unavailable`."""

import pytest
import torch

from harness.cells import Cell, ClassContext, compare, run_cell, within_eager_half_error
from harness.models import select
from harness.plan import SweepPlan, make_plan
from harness.records import cell_id, column_of, parse_cell_id
from harness.store import RunStore
from harness.sweep import Plan, Progress, run_sweep
from harness.tables import DTYPE_TOLERANCE
from harness.workers import WorkerOptions, warm_imports


@pytest.fixture(scope="module")
def bert():
    return ClassContext(select("BertModel")[0]).prepare()


def test_a_cell_id_names_its_dtype_unless_float32():
    assert cell_id("BertModel", "onnx", "static") == "BertModel-onnx-static"
    assert cell_id("BertModel", "onnx", "static", "bfloat16") == "BertModel-onnx-static-bfloat16"
    assert parse_cell_id("BertModel-onnx-static-bfloat16") == ("BertModel", "onnx", "static", "bfloat16")
    assert parse_cell_id("BertModel-onnx-static") == ("BertModel", "onnx", "static", "float32")
    assert column_of("dynamic", "float16") == "dynamic-float16" and column_of("dynamic") == "dynamic"


@pytest.mark.parametrize("backend", ["dynamo", "executorch"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_cell_exports_and_runs_in_its_dtype(bert, backend, dtype):
    record = run_cell(Cell(bert.model_class, backend, "static", dtype), bert)
    assert (record.status, record.stage) == ("pass", "parity"), record.message
    assert record.cell_id == f"BertModel-{backend}-static-{dtype}" and record.dtype == dtype
    assert (record.atol, record.tolerance_reason) == DTYPE_TOLERANCE[dtype]
    assert f"--dtypes {dtype}" in record.repro
    cast = bert.in_dtype(dtype)
    assert {value.dtype for value in cast.expected["A"].values() if value.is_floating_point()} == {getattr(torch, dtype)}
    assert next(bert.model.parameters()).dtype == torch.float32, "the float32 model is left as it was"


def test_float32_cells_keep_their_tolerance_and_model(bert):
    record = run_cell(Cell(bert.model_class, "dynamo", "static"), bert)
    assert record.status == "pass" and record.atol == 1e-4 and record.tolerance_reason is None
    assert bert.in_dtype("float32") is bert


@pytest.mark.parametrize("name, operator", [("BertModel", "Add"), ("ViTModel", "Conv")])
def test_a_bfloat16_operator_onnx_runtime_cannot_run_is_unavailable_not_failed(name, operator):
    """ONNX Runtime's CPU provider has no bfloat16 Add; the ONNX standard allows Conv no bfloat16 input."""
    context = ClassContext(select(name)[0]).prepare()
    record = run_cell(Cell(context.model_class, "onnx", "static", "bfloat16"), context)
    assert (record.status, record.stage, record.error_type) == ("unavailable", "load", "RuntimeDtypeUnsupported")
    assert f"runs no bfloat16 {operator} on this CPU" in record.message


def test_a_sweep_over_dtypes_runs_each_cell_once_in_one_worker(tmp_path):
    warm_imports(["dynamo"])
    store = RunStore(tmp_path / "run")
    store.create({})
    plan = Plan(select("BertModel"), ("dynamo",), ("static",), ("float32", "float16"))
    assert run_sweep(plan, store, WorkerOptions(timeout=300), jobs=1, progress=Progress(plan.total, every=60)) == {
        "pass": 2
    }
    assert store.cell_ids() == {"BertModel-dynamo-static", "BertModel-dynamo-static-float16"}


def test_a_plan_keeps_its_dtypes_and_a_float32_plan_its_digest(tmp_path):
    models = select("BertModel")
    float32 = make_plan(models, ["dynamo"], ["static"], {"models": "BertModel"})
    half = make_plan(models, ["dynamo"], ["static"], {"models": "BertModel"}, dtypes=["float32", "bfloat16"])
    assert half.cells() == ["BertModel-dynamo-static", "BertModel-dynamo-static-bfloat16"]
    loaded = SweepPlan.load(half.save(tmp_path / "plan.json"))
    assert loaded.dtypes == ["float32", "bfloat16"] and loaded.digest == half.digest != float32.digest
    old_file = float32.to_dict()
    del old_file["dtypes"]  # written before the dtype axis
    assert SweepPlan(**{k: old_file[k] for k in ("selection", "backends", "shapes", "shards", "classes")}).digest == (
        float32.digest
    )


def _parity(actual, eager_half, eager_float32):
    atol = DTYPE_TOLERANCE["float16"][0]
    ok, details, _abs, _rel = compare({"out": actual}, {"out": eager_half}, atol, atol)
    assert not ok, "the case starts beyond the tolerance from eager in float16"
    return within_eager_half_error({"out": actual}, {"out": eager_half}, {"out": eager_float32}, atol, atol, details), details["out"]


def test_a_half_program_as_far_from_float32_as_half_eager_passes():
    truth = torch.linspace(-1, 1, 64, dtype=torch.float32)
    eager_half = (truth + 0.05).half()  # eager rounds one way, the program the other
    ok, detail = _parity((truth - 0.05).half(), eager_half, truth)
    assert ok and detail["ok"]
    assert detail["eager_float32_abs"] == pytest.approx(0.05, abs=1e-3) and detail["float32_abs"] == pytest.approx(0.05, abs=1e-3)


def test_a_half_program_further_from_float32_than_half_eager_fails():
    truth = torch.linspace(-1, 1, 64, dtype=torch.float32)
    ok, detail = _parity((truth + 0.3).half(), (truth + 0.05).half(), truth)
    assert not ok and not detail["ok"] and detail["float32_abs"] == pytest.approx(0.3, abs=1e-3)


def test_half_eager_that_overflowed_grants_no_error_budget():
    truth = torch.full((8,), 70000.0)
    eager_half = truth.half()  # inf: float16 ends at 65504
    ok, detail = _parity(torch.zeros(8).half(), eager_half, truth)
    assert not ok and "float32_abs" not in detail


def test_a_deep_convolutional_net_in_float16_passes_on_its_error_against_float32():
    """MobileNetV1's float16 logits through ONNX Runtime differ from float16 eager beyond 1.6e-2 (both round
    differently over every layer), but stray from float32 eager within twice what float16 eager itself does."""
    context = ClassContext(select("MobileNetV1ForImageClassification")[0]).prepare()
    record = run_cell(Cell(context.model_class, "onnx", "static", "float16"), context)
    assert (record.status, record.stage) == ("pass", "parity"), record.message
    logits = record.parity["logits"]
    assert logits["abs"] > DTYPE_TOLERANCE["float16"][0], "beyond the tolerance from float16 eager"
    assert logits["float32_abs"] <= 2 * logits["eager_float32_abs"] + DTYPE_TOLERANCE["float16"][0]
    assert "within 2x its own error against float32 eager" in record.stages[-1].message
