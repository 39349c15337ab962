"""Run folders for the dashboard tests: one produced by the real harness on tiny models, and synthetic ones for the
edge cases (empty, all failing, 2,000 cells, hostile text)."""

import random
import sys
from pathlib import Path

import pytest

from harness.records import CellRecord, StageRecord
from harness.store import RunStore

ONNX_STAGES = ["torch-patches", "signature", "model-patches", "pytree", "dynamic-shapes", "state-cleanup",
               "torch-export", "fx-node-fixes", "onnx-patches", "decompositions", "onnx-translation", "optimize",
               "ir-fixes"]  # fmt: skip


def synthetic_record(model, backend="onnx", shape="static", status="pass", stage="parity", message=None,
                     traceback=None, model_type="bert", max_abs=1e-7):  # fmt: skip
    record = CellRecord(model, model_type, "causal-lm", backend, shape, tasks=["causal-lm", "base"])
    names = ["config", "build", "eager", *ONNX_STAGES, "load", "run", "parity"]
    for name in names[: names.index(stage) + 1]:
        failed = name == stage and status != "pass"
        record.stages.append(StageRecord(name, status if failed else "pass", 0.01, "RuntimeError" if failed else None,
                                         message if failed else None))  # fmt: skip
    if stage == "parity":
        record.max_abs_diff, record.max_rel_diff, record.atol, record.rtol = max_abs, max_abs, 1e-3, 1e-3
        record.parity = {"logits": {"ok": status == "pass", "abs": max_abs, "rel": max_abs, "shape": [2, 7, 99]}}
    record.traceback = traceback
    record.repro = f"export-sweep run --models {model} --backends {backend} --shapes {shape} --no-cache"
    return record.finish()


COLUMNS = [(backend, shape) for backend in ("dynamo", "onnx", "executorch") for shape in ("static", "dynamic")]


def synthetic_run(directory: Path, cells: int, seed: int = 0, failing: float = 0.3, columns=COLUMNS) -> RunStore:
    """``cells`` records, ``len(columns)`` per class, a share of them failing at assorted stages."""
    rng = random.Random(seed)
    store = RunStore(directory)
    store.create({"models": "synthetic", "backends": sorted({b for b, _ in columns}),
                  "shapes": sorted({s for _, s in columns})})  # fmt: skip
    for number in range(cells):
        index, (backend, shape) = divmod(number, len(columns))[0], columns[number % len(columns)]
        model, model_type = f"Model{index:04d}ForCausalLM", f"type{index % 40}"
        if rng.random() < failing:
            stage = rng.choice(["eager", "torch-export", "decompositions", "onnx-translation", "parity"])
            record = synthetic_record(model, backend, shape, "fail", stage,
                                      f"Cannot do thing {rng.randint(0, 9)} at dim {rng.randint(0, 3)}",
                                      "Traceback (most recent call last):\n  ...\nRuntimeError: boom",
                                      model_type=model_type, max_abs=0.5)  # fmt: skip
        else:
            record = synthetic_record(model, backend, shape, model_type=model_type, max_abs=10 ** -rng.randint(5, 9))
        store.write(record)
    store.finish()
    return store


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    """A run of the real harness: two tiny classes, Dynamo and ONNX, static; one cell fails for real."""
    from exporters import registration, workarounds
    from harness.models import select
    from harness.sweep import Plan, Progress, run_sweep
    from harness.workers import WorkerOptions, warm_imports

    directory = tmp_path_factory.mktemp("real-run")
    store = RunStore(directory)
    store.create({"models": "BertModel,GPT2Model", "backends": ["dynamo", "onnx"], "shapes": ["static"]})
    workarounds.load_registrations()  # before saving: restoring must not drop the exporters' own patches
    saved = list(registration.PATCHES["onnx"])

    @registration.register_patch("onnx", "torch.nn.functional.layer_norm", model_side="planted by a test")
    def _patch_break_gpt2(original):  # a real ONNX failure for one class, in the ONNX stage it happens in
        def layer_norm(input, *args, **kwargs):
            if input.shape[-1] == 32 and input.dim() == 3 and input.shape[1] == 7 and _is_gpt2():
                print("layer norm of <32> refused", file=sys.stderr)  # what a library says before it fails
                raise NotImplementedError("no lowering for this layer norm <script>alert(1)</script>")
            return original(input, *args, **kwargs)

        return layer_norm

    warm_imports(["dynamo", "onnx"])
    try:
        plan = Plan(select("BertModel,GPT2Model"), ("dynamo", "onnx"), ("static",))
        run_sweep(plan, store, WorkerOptions(timeout=300, log_dir=store.logs_dir), jobs=2, progress=Progress(plan.total, every=60))
    finally:
        registration.PATCHES["onnx"][:] = saved
    store.finish()
    return directory


def _is_gpt2():
    import traceback

    return any("modeling_gpt2" in frame.filename for frame in traceback.extract_stack())
