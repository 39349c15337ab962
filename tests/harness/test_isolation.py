"""Warm workers isolate each cell: a segfault, a hang or a memory blow-up fails that cell only, with its stage,
and the class' next cell runs in a fresh worker. The faults are real: a patch installed for the Dynamo trace
dereferences NULL, sleeps, or allocates, inside the forked child."""

import ctypes
import subprocess
import sys
import time

import pytest
import torch

from exporters import registration, workarounds
from harness.cells import Cell, ClassContext, run_cell
from harness.models import select
from harness.store import RunStore
from harness.sweep import Plan, Progress, run_sweep
from harness.workers import WorkerOptions, warm_imports


def _segfault():
    ctypes.string_at(0)


def _hang():
    time.sleep(3600)


def _blow_up_memory():
    hoard = b"x" * (1 << 30)  # 1 GiB, written (a torch tensor would be a fake one while tracing)
    time.sleep(60)
    return hoard


@pytest.fixture
def fault_once(tmp_path):
    """Install a Dynamo patch that runs ``fault`` the first time a trace calls it (a marker file remembers)."""
    workarounds.load_registrations()  # before saving: restoring must not drop the exporters' own patches
    saved = list(registration.PATCHES["dynamo"])

    def install(fault):
        marker = tmp_path / "fault-done"

        @registration.register_patch("dynamo", "torch.nn.functional.scaled_dot_product_attention", model_side="planted by a test")
        def _patch_fault(original):
            def sdpa(*args, **kwargs):
                if not marker.exists():
                    marker.write_text("x")
                    fault()
                return original(*args, **kwargs)

            return sdpa

    yield install
    registration.PATCHES["dynamo"][:] = saved


@pytest.mark.parametrize(
    "fault, status, message, last_words",
    [
        (_segfault, "crash", "died of SIGSEGV (segmentation fault) in stage torch-export", "Segmentation fault"),
        (_hang, "timeout", "ran past the 20 s cell timeout in stage torch-export", "most recent call first"),
        (_blow_up_memory, "oom", "over the 900 MB memory cap, in stage torch-export", "most recent call first"),
    ],
    ids=["segfault", "hang", "memory"],
)
def test_a_faulty_cell_fails_alone_and_the_sweep_goes_on(tmp_path, fault_once, fault, status, message, last_words):
    fault_once(fault)
    warm_imports(["dynamo"])
    store = RunStore(tmp_path / "run")
    store.create({})
    plan = Plan(select("BertModel"), ("dynamo",), ("static", "dynamic"))
    options = WorkerOptions(timeout=20, memory_cap_mb=900, log_dir=store.logs_dir)
    counts = run_sweep(plan, store, options, jobs=1, progress=Progress(plan.total, every=60))
    first, second = store.read("BertModel-dynamo-static"), store.read("BertModel-dynamo-dynamic")
    assert (first.status, first.stage) == (status, "torch-export"), "the exporter stage it was in, not just 'export'"
    assert message in first.message
    # the cell's part of the class log says where it crashed, hung or grew: the Python stack
    log, next_log = store.cell_log(first), store.cell_log(second)
    assert log is not None and next_log is not None, "each cell's part of the class log is found"
    assert last_words in log and f"in {fault.__name__}" in log, log
    assert f"in {fault.__name__}" not in next_log, "the next cell's part is its own"
    names = [s.name for s in first.stages]
    assert names[:3] == ["config", "build", "eager"], "shared stages kept"
    assert {"signature", "dynamic-shapes"} <= set(names[3:-1]), "the exporter stages that ended before it kept"
    assert all(s.status == "pass" for s in first.stages[:-1])
    assert second.status == "pass", "the next cell ran in a fresh worker"
    assert counts == {status: 1, "pass": 1}


def test_memory_shared_with_the_parent_does_not_count_against_the_cap(tmp_path):
    """Under ``pytest -n auto`` the forking process may already hold gigabytes; the cap is the cell's own memory."""
    ballast = b"x" * (1200 << 20)  # written, so resident in the parent and inherited by every forked child
    warm_imports(["dynamo"])
    store = RunStore(tmp_path / "run")
    plan = Plan(select("BertModel"), ("dynamo",), ("static",))
    run_sweep(plan, store, WorkerOptions(timeout=120, memory_cap_mb=900), jobs=1, progress=Progress(1, every=60))
    record = store.read("BertModel-dynamo-static")
    assert record.status == "pass", record.message
    assert 0 < record.peak_rss_mb < 900 < len(ballast) >> 20


def test_a_crash_in_a_shared_stage_is_not_retried_for_every_cell(tmp_path, monkeypatch):
    from harness import cells

    def crash_building(self):
        _segfault()

    monkeypatch.setattr(cells.ClassContext, "_build", crash_building)  # inherited by the forked child
    warm_imports(["dynamo"])
    store = RunStore(tmp_path / "run")
    plan = Plan(select("BertModel"), ("dynamo", "onnx"), ("static",))
    started = time.monotonic()
    run_sweep(plan, store, WorkerOptions(timeout=60), jobs=1, progress=Progress(plan.total, every=60))
    records = store.records()
    assert [(r.status, r.stage) for r in records] == [("crash", "build")] * 2
    assert "not retried" in records[1].message
    assert time.monotonic() - started < 60


def test_cells_of_one_class_share_the_built_model(tmp_path):
    warm_imports(["dynamo"])
    store = RunStore(tmp_path / "run")
    plan = Plan(select("BertModel"), ("dynamo",), ("static", "dynamic"))
    run_sweep(plan, store, WorkerOptions(timeout=120), jobs=1, progress=Progress(plan.total, every=60))
    first, second = store.read("BertModel-dynamo-static"), store.read("BertModel-dynamo-dynamic")
    assert first.status == second.status == "pass"
    assert first.worker == second.worker
    build = [[s for s in r.stages if s.name == "build"][0] for r in (first, second)]
    assert build[0].seconds == build[1].seconds, "built once: both cells carry the same build stage"


def _bert_cell_with_layer_norm_patch(shape_mode, factory, context=None):
    """BertModel's Dynamo cell (of ``context``, else a fresh one), traced with ``factory`` patching layer norm; the
    patch is unregistered after."""
    workarounds.load_registrations()
    saved = list(registration.PATCHES["dynamo"])
    registration.register_patch("dynamo", "torch.nn.functional.layer_norm", model_side="planted by a test")(factory)
    try:
        context = context or ClassContext(select("BertModel")[0])
        return run_cell(Cell(context.model_class, "dynamo", shape_mode), context)
    finally:
        registration.PATCHES["dynamo"][:] = saved


def test_parity_mismatch_is_recorded_with_diffs_not_raised(tmp_path):
    """A Dynamo patch that nudges layer norm during the trace: the exported program differs from eager."""

    def _patch_nudge_layer_norm(original):
        return lambda *args, **kwargs: original(*args, **kwargs) + 0.5

    record = _bert_cell_with_layer_norm_patch("static", _patch_nudge_layer_norm)
    assert (record.status, record.stage) == ("fail", "parity")
    assert record.max_abs_diff > 1e-4 and record.atol == 1e-4
    assert record.parity["last_hidden_state"]["ok"] is False
    assert record.max_abs_diff == max(detail["abs"] for detail in record.parity.values())
    assert "outputs differ from eager beyond atol=0.0001" in record.message
    assert "_patch_nudge_layer_norm" in record.applied


def test_axis_the_export_fixed_fails_the_dynamic_cell_by_name(tmp_path):
    """A Dynamo patch that reshapes to the traced batch: torch.export's Dim.AUTO quietly fixes the batch axis."""

    def _patch_fix_batch(original):
        return lambda input, *args, **kwargs: original(input.reshape(2, *input.shape[1:]), *args, **kwargs)

    record = _bert_cell_with_layer_norm_patch("dynamic", _patch_fix_batch)
    assert (record.status, record.stage) == ("fail", "dynamic-axes")
    assert "input_ids axis 0 = 2 (second set: 3)" in record.message


def _cell_planting(context, write):
    """BERT's Dynamo static cell of ``context``, with a planted patch that calls ``write()`` as the export installs
    it."""

    def _patch_write_into_the_class(original):
        write()
        return original

    return _bert_cell_with_layer_norm_patch("static", _patch_write_into_the_class, context)


def test_a_cell_that_writes_into_its_class_fails_by_name_and_later_cells_run_on_the_class_as_built():
    """BLIP's generate() once wrote into the class's prompt, and every later cell of the class was compared on other
    tokens. Planted here: a patch that, as the export installs it, writes into the class's inputs and a weight."""
    context = ClassContext(select("BertModel")[0]).prepare()

    def write():
        context.inputs["A"]["input_ids"][0, 0] += 1
        with torch.no_grad():
            context.model.embeddings.word_embeddings.weight[3, :2] = 9.0

    written = _cell_planting(context, write)
    guard = written.stages[-1]
    assert (guard.name, guard.status, guard.error_type) == ("shared-state", "fail", "SharedStateChanged")
    assert f"inputs['A']['input_ids'] (1 of {context.inputs['A']['input_ids'].numel()} values written" in guard.message
    assert "weights['embeddings.word_embeddings.weight'] (2 of " in guard.message
    assert "restored from the copy taken after eager" in guard.message
    assert written.status == "fail", "a cell that wrote into its class never passes"
    after = run_cell(Cell(context.model_class, "dynamo", "static"), context)
    assert after.status == "pass", after.message
    assert [stage.name for stage in after.stages][-1] == "parity", "nothing written: no shared-state stage"


def _replace_a_weight_by_another_shape(model):
    model.pooler.dense.weight = torch.nn.Parameter(torch.zeros(3, 3))


def _register_a_buffer(model):
    model.register_buffer("left_behind", torch.zeros(2))


@pytest.mark.parametrize("write, named", [
    (_replace_a_weight_by_another_shape, "weights['pooler.dense.weight'] (torch.float32 ["),
    (_register_a_buffer, "weights: its structure"),
], ids=["reshaped", "added"])  # fmt: skip
def test_weights_that_cannot_be_put_back_get_the_class_built_again(write, named):
    context = ClassContext(select("BertModel")[0]).prepare()
    built = context.model
    written = _cell_planting(context, lambda: write(context.model))
    guard = written.stages[-1]
    assert guard.name == "shared-state" and named in guard.message
    assert "it could not be put back, so the class is built again for its next cell" in guard.message
    after = run_cell(Cell(context.model_class, "dynamo", "static"), context)
    assert after.status == "pass", after.message
    assert context.model is not built


def _last_line_printed(probe: str) -> str:
    """Run ``probe`` in a fresh Python, which must succeed; the last line it printed."""
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip().splitlines()[-1]


def test_a_forked_child_installs_every_patch_without_importing_a_module():
    """The parent imports every patch's module before it forks: no child's first export pays for them again."""
    probe = (
        "import sys\n"
        "from harness.workers import warm_imports\n"
        "warm_imports(['dynamo'])\n"
        "from exporters.registration import apply_patches\n"
        "before = set(sys.modules)\n"
        "with apply_patches('dynamo'):\n"
        "    pass\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    assert _last_line_printed(probe) == "[]"


def test_a_forked_child_finds_xnnpack_graphs_built_and_runs_parallel_ops():
    """The parent builds XNNPACK's reference graphs once; a child forked after that still runs on two threads (a
    parent's OpenMP pool would hang it)."""
    probe = (
        "import os, time, torch\n"
        "from harness.workers import warm_imports\n"
        "warm_imports(['executorch'])\n"
        "from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    torch.set_num_threads(2)\n"
        "    torch.nn.functional.gelu(torch.randn(2000, 2000)).sum()\n"
        "    built = sdpa.get_graphs.cache_info().currsize, bilinear_2d._get_bilinear_2d_graphs.cache_info().currsize\n"
        "    os._exit(0 if built == (1, 1) else 3)\n"
        "deadline = time.monotonic() + 60\n"
        "while time.monotonic() < deadline:\n"
        "    done, status = os.waitpid(pid, os.WNOHANG)\n"
        "    if done:\n"
        "        print('child exit', os.waitstatus_to_exitcode(status))\n"
        "        break\n"
        "    time.sleep(0.2)\n"
        "else:\n"
        "    os.kill(pid, 9)\n"
        "    print('child hung')\n"
    )
    assert _last_line_printed(probe) == "child exit 0"
