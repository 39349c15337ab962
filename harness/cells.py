"""A cell is a loop over named stages that stops at the first one that does not pass.

``ClassContext`` does the work every cell of a class shares, once: ``config``, ``build`` and ``eager`` (the
reference outputs for both input sets). ``run_cell`` then runs the backend's export stages, ``load``, ``run`` and
``parity``. Nothing here forks or times out: ``harness.workers`` runs this in isolated processes.
"""

from __future__ import annotations

import math
import re
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from .models import ModelClass
from .records import DEFAULT_TOLERANCE, DTYPES, CellRecord, StageRecord, cell_id
from .shared_state import KeptState
from .store import now
from .tables import DTYPE_TOLERANCE, HALF_ERROR_MARGIN, TOLERANCE_OVERRIDES

# Export with input set A; a dynamic export must also run input set B (another batch and length).
RUN_INPUT_SET = {"static": "A", "dynamic": "B"}
# Two eager calls may differ by rounding and still be one function: ViLT draws the order of its image patches at
# random, and its pooled outputs differ only in the order of their sums. Far below every parity tolerance.
REPEAT_TOLERANCE = 1e-6
BATCH_NORM_DRAWS = 8  # input draws a batch norm's statistics are averaged over (each a batch of input set A)


@dataclass
class Cell:
    model: ModelClass
    backend: str
    shape_mode: str
    dtype: str = DTYPES[0]

    @property
    def id(self) -> str:
        return cell_id(self.model.name, self.backend, self.shape_mode, self.dtype)


class StageFailure(Exception):
    """A stage's own verdict (not a crash): ``status`` is fail/skip/unavailable."""

    def __init__(self, status: str, message: str, error_type: str = "StageFailure", details: dict | None = None):
        super().__init__(message)
        self.status, self.error_type, self.details = status, error_type, details or {}


_MISSING_PACKAGE = re.compile(r"requires the (\w[\w-]*) library|No module named '([\w.]+)'")


def classify(error: BaseException) -> tuple[str, str, str]:
    """``(status, error type, message)`` for an exception raised by a stage."""
    if isinstance(error, StageFailure):
        return error.status, error.error_type, str(error)
    message = str(error).strip() or repr(error)
    if isinstance(error, ImportError):
        match = _MISSING_PACKAGE.search(message)
        if match:
            package = (match.group(1) or match.group(2)).split(".")[0]
            return "unavailable", type(error).__name__, f"needs the {package} package, which is not installed here"
    if isinstance(error, MemoryError):
        return "oom", "MemoryError", message
    error_type = getattr(error, "cause_type", None) or type(error).__name__
    return "fail", error_type, message


def failed_stage(name: str, error: BaseException, seconds: float) -> tuple[StageRecord, str]:
    """The record of a stage that raised ``error``, and the traceback to keep with the cell."""
    status, error_type, message = classify(error)
    details = dict(getattr(error, "details", {}) or {})
    trace = getattr(error, "cause_traceback", None) or "".join(traceback.format_exception(error))
    return StageRecord(name, status, round(seconds, 4), error_type, message[:20000], details), trace


def run_stage(name: str, step: Callable[[], Any]) -> tuple[StageRecord, Any, str | None]:
    """Run one stage: ``(record, result, traceback or None)``."""
    start = time.perf_counter()
    try:
        result = step()
    except Exception as error:  # a stage's failure is data, not an exception
        record, trace = failed_stage(name, error, time.perf_counter() - start)
        return record, None, trace
    return StageRecord(name, "pass", round(time.perf_counter() - start, 4)), result, None


class ClassContext:
    """The shared work of one model class: its tiny config, model, inputs and eager outputs."""

    def __init__(self, model_class: ModelClass, seed: int = 0):
        self.model_class = model_class
        self.seed = seed
        self.stages: list[StageRecord] = []
        self.traceback: str | None = None
        self.config = self.model = None
        self.inputs: dict[str, dict] = {}
        self.expected: dict[str, dict] = {}
        self.float32_expected: dict[str, dict] = {}  # in another dtype: eager's float32 outputs, the truth of both
        self.input_set: str | None = None
        self.modules: list[str] = []  # what a workaround for one model family can touch: the cache's scope
        self.prepared = False
        self.dtype = DTYPES[0]
        self._in_dtypes: dict[str, ClassContext] = {}
        self.kept: KeptState | None = None  # what its cells read, as eager left it

    @property
    def ok(self) -> bool:
        return self.prepared and all(stage.status == "pass" for stage in self.stages)

    def prepare(self, on_stage: Callable[[str], None] | None = None) -> ClassContext:
        """Run the shared stages once; ``on_stage(name)`` is told before each starts."""
        if self.prepared:
            return self
        for name, step in (("config", self._config), ("build", self._build), ("eager", self._eager)):
            if on_stage is not None:
                on_stage(name)
            record, _result, trace = run_stage(name, step)
            self.stages.append(record)
            if record.status != "pass":
                self.traceback = trace
                break
        self.prepared = True
        return self

    def in_dtype(self, dtype: str) -> ClassContext:
        """This class in another dtype, built once: the model and the floating inputs cast, eager's outputs computed
        again in that dtype. The float32 checks of ``eager`` (signal, determinism, modalities) hold for it."""
        if dtype == self.dtype or not self.ok:
            return self
        if dtype not in self._in_dtypes:
            self._in_dtypes[dtype] = self._cast(dtype)
        return self._in_dtypes[dtype]

    def _cast(self, dtype: str) -> ClassContext:
        import copy

        import torch

        cast = ClassContext(self.model_class, self.seed)
        cast.config, cast.input_set, cast.modules, cast.dtype = self.config, self.input_set, self.modules, dtype
        cast.stages = [StageRecord(**vars(stage)) for stage in self.stages if stage.name != "eager"]
        cast.prepared, cast.float32_expected = True, self.expected
        torch_dtype = getattr(torch, dtype)

        def eager_in_dtype():
            cast.model = copy.deepcopy(self.model).to(torch_dtype)
            for label, inputs in self.inputs.items():
                cast.inputs[label] = torch.utils._pytree.tree_map_only(
                    torch.Tensor, lambda value: value.to(torch_dtype) if value.is_floating_point() else value, inputs
                )
                try:
                    cast.expected[label] = cast._forward(cast.inputs[label])
                except Exception as error:  # PyTorch's own CPU kernels: nothing to export against
                    raise StageFailure(
                        "unavailable", f"eager PyTorch cannot run this model in {dtype} on the CPU: "
                        f"{type(error).__name__}: {str(error).strip()[:500]}", "EagerDtypeUnsupported",
                    ) from error  # fmt: skip

        record, _result, trace = run_stage("eager", eager_in_dtype)
        cast.stages.append(record)
        cast.traceback = trace
        return cast

    def forget(self) -> None:
        """Drop everything built: the next ``prepare`` builds the class again."""
        self.__init__(self.model_class, self.seed)

    def _config(self):
        from .tiny import tiny_config

        self.config = tiny_config(self.model_class)

    def _build(self):
        import torch

        model_class = self.model_class.load()
        if model_class.forward is torch.nn.Module.forward:
            raise StageFailure(
                "unavailable", f"{model_class.__name__} has no forward of its own (it only generates, through its "
                "parts): there is no graph to export, its parts are swept as classes of their own", "NoForward",
            )  # fmt: skip
        torch.manual_seed(self.seed)
        self.model = model_class(self.config).eval()
        self.modules = sorted({type(module).__module__ for module in self.model.modules()
                               if type(module).__module__.startswith("transformers.")})  # fmt: skip
        _wake_zero_weights(self.model)

    def _eager(self):
        import torch

        import exporters

        from .inputs import make_inputs

        exporters.register_pytree_nodes(self.model)
        for label in RUN_INPUT_SET.values():
            self.inputs[label], self.input_set = make_inputs(self.model, label, seed=self.seed)
            if label == "A":
                self._measure_batch_norm_statistics(label)
            self.expected[label] = self._forward(self.inputs[label])
        if not self.expected["A"]:
            raise StageFailure("fail", "the model returned no tensor outputs", "NoOutputs")
        largest = max((float(value.abs().max()) if value.is_floating_point() and value.numel() else math.inf)
                      for value in self.expected["A"].values())  # fmt: skip
        if largest <= max(DEFAULT_TOLERANCE.values()):
            raise StageFailure(
                "fail", f"every output is within the parity tolerance of zero (largest |value| {largest:.1e}): a program "
                "returning zeros would match it; the signal fades out before the outputs", "VanishingOutputs",
            )  # fmt: skip
        repeat = self._forward(self.inputs["A"], seed=self.seed + 1)
        unstable = [
            name for name, value in self.expected["A"].items() if not _same(value, repeat.get(name), REPEAT_TOLERANCE)
        ]
        if unstable:
            raise StageFailure(
                "fail", f"eager outputs change between two calls with the same inputs (random sampling in forward): "
                f"{', '.join(unstable[:5])}", "NonDeterministic",
            )  # fmt: skip
        from .inputs import MODALITY_INPUTS, unfed_modalities

        unfed = unfed_modalities(self.model, self.inputs["A"])
        if unfed:
            raise StageFailure(
                "fail", f"no inputs were built for {', '.join(unfed)}: the {MODALITY_INPUTS[unfed[0]]} branch would not "
                f"run (inputs: {self.input_set})", "ModalityNotFed",
            )  # fmt: skip
        for name, value in self.inputs["A"].items():
            if name in MODALITY_INPUTS and isinstance(value, torch.Tensor) and value.is_floating_point():
                perturbed = {**self.inputs["A"], name: value + torch.randn_like(value).abs() + 0.5}
                changed = self._forward(perturbed)
                if all(_same(expected, changed.get(output)) for output, expected in self.expected["A"].items()):
                    raise StageFailure(
                        "fail", f"{name} did not change any output: the {MODALITY_INPUTS[name]} branch did not run "
                        f"(inputs: {self.input_set})", "ModalityIgnored",
                    )  # fmt: skip

    def _measure_batch_norm_statistics(self, label: str) -> None:
        """Batch norms' running statistics measured on input set ``label`` and other draws of it, as training leaves
        them measured on its data.

        Fresh ones (mean 0, variance 1) make each evaluation-mode batch norm a plain scale: the small random
        convolutions between them shrink the signal layer after layer, and a deep tiny network (MobileNet, EfficientNet,
        HGNet) outputs 1e-16 to 1e-36, which any program matches. But a measured variance near zero (a norm after the
        spatial size is down to one pixel sees two values per channel in a batch of two; a channel that is constant on
        every input has none) divides rounding by it: two correct kernels (ONNX Runtime's or XNNPACK's, and PyTorch's)
        then gave MobileNetV2 outputs 3e-2 apart and PP-OCRv5's detector 2e-2 apart, and eager itself moved by 2e-2
        when its image moved by 1e-7. So the statistics are averaged over BATCH_NORM_DRAWS draws of the inputs, and
        no channel is normalized more sharply than its norm's median channel: both now within 1.4e-4. Only the batch
        norms measure; the rest stays in evaluation mode (no dropout).
        """
        import torch

        from .inputs import make_inputs

        norms = [module for module in self.model.modules()
                 if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.track_running_stats]  # fmt: skip
        if not norms:
            return
        momenta = [norm.momentum for norm in norms]
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average: exactly the draws' statistics
            norm.train()
        try:
            self._forward(self.inputs[label])
            for draw in range(1, BATCH_NORM_DRAWS):
                self._forward(make_inputs(self.model, label, seed=self.seed + draw)[0])
        finally:
            for norm, momentum in zip(norms, momenta):
                norm.momentum = momentum
                norm.eval()
        with torch.no_grad():
            for norm in norms:
                norm.running_var.clamp_(min=float(norm.running_var.median()))

    def _forward(self, inputs: dict, seed: int | None = None) -> dict:
        import torch

        import exporters

        torch.manual_seed(self.seed if seed is None else seed)
        with torch.no_grad():
            return {name: value.detach().clone() for name, value in exporters.named_leaves(self.model(**inputs)).items()}


def _wake_zero_weights(model) -> None:
    """Give small random values to weights a fresh model starts at zero (projections, tanh gates, layer scales),
    and norm layers a scale near one.

    Trained checkpoints have them non-zero; at zero a whole branch (Gemma 3's image projection, Mllama's
    cross-attention gates) contributes nothing, and neither parity nor the modality check can see it run.
    """
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.is_floating_point() and not name.endswith("bias") and not parameter.any():
                parameter.normal_(0.0, 0.02)
        # Norm scales drawn around zero (EfficientNet initialises batch norms like linears) shrink the signal at
        # every layer until a deep tiny network outputs a constant; trained ones sit near one.
        norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, norms) and weight is not None and weight.is_floating_point() and weight.abs().mean() < 0.1:
                weight.normal_(1.0, 0.02)
        # Vector-quantizer codebooks start at zero until trained (EnCodec's, Mimi's): every frame then takes the same
        # code, and the decoded audio is the same whatever the input.
        for name, buffer in model.named_buffers():
            codebook = name.rsplit(".", 1)[-1] in ("embed", "embed_sum") and buffer.dim() == 2
            if codebook and buffer.is_floating_point() and not buffer.any():
                buffer.normal_(0.0, 0.02)  # small beside the frames: the nearest code follows their direction


def _same(a, b, tolerance: float = 0.0) -> bool:
    import torch

    if a is None or b is None or a.shape != b.shape:
        return False
    if a.is_floating_point() or a.is_complex():
        a, b = torch.nan_to_num(a), torch.nan_to_num(b)
        return bool(torch.allclose(a, b, atol=tolerance, rtol=tolerance) if tolerance else torch.equal(a, b))
    return bool(torch.equal(a, b))


def tolerance_for(model_class: str, backend: str, dtype: str = DTYPES[0]) -> tuple[float, float, str | None]:
    default = DEFAULT_TOLERANCE[backend]
    override = TOLERANCE_OVERRIDES.get(model_class)
    if override and backend in override.get("backends", [backend]):
        atol, rtol, reason = override.get("atol", default), override.get("rtol", default), override["reason"]
    else:
        atol, rtol, reason = default, default, None
    if dtype in DTYPE_TOLERANCE:  # the wider of the two, with the reason that set it
        half, why = DTYPE_TOLERANCE[dtype]
        if half > max(atol, rtol):
            return max(atol, half), max(rtol, half), why
    return atol, rtol, reason


def joined_parts(actual: dict, expected: dict) -> tuple[dict, dict[str, int]]:
    """A program cannot return a list as long as the image count: where an export keeps per-image parts whole (its
    ``P.0`` alone where eager has ``P.0`` to ``P.n``), eager's parts are joined along their first axis to be compared
    with it. Returns the expected outputs so joined, and how many parts each joined name holds."""
    import torch

    def parts_of(prefix):
        count = 0
        while f"{prefix}.{count}" in expected:
            count += 1
        return [expected[f"{prefix}.{index}"] for index in range(count)]

    joined, counts = {}, {}
    for name, reference in expected.items():
        prefix, _, index = name.rpartition(".")
        if index.isdigit() and f"{prefix}.0" in counts:
            continue  # joined into its first part
        parts = parts_of(prefix) if index == "0" and f"{prefix}.1" in expected and f"{prefix}.1" not in actual else []
        if name in actual and len(parts) > 1 and len({part.shape[1:] for part in parts}) == 1:
            joined[name], counts[name] = torch.cat(parts), len(parts)
        else:
            joined[name] = reference
    return joined, counts


def compare(actual: dict, expected: dict, atol: float, rtol: float) -> tuple[bool, dict, float, float]:
    """Every eager output against the artifact's: ``(all close, per-output details, max abs, max rel)``."""
    import torch

    expected, joined_counts = joined_parts(actual, expected)
    details, max_abs, max_rel, ok = {}, 0.0, 0.0, True
    for name, reference in expected.items():
        value = actual.get(name)
        if value is None:
            details[name] = {"ok": False, "problem": "missing from the artifact's outputs"}
            ok = False
            continue
        if tuple(value.shape) != tuple(reference.shape):
            details[name] = {"ok": False, "problem": f"shape {tuple(value.shape)}, eager {tuple(reference.shape)}"}
            ok = False
            continue
        if reference.numel() == 0:
            details[name] = {"ok": True, "abs": 0.0, "rel": 0.0, "shape": list(reference.shape)}
            continue
        a, b = value.detach().to(torch.float64), reference.detach().to(torch.float64)
        if reference.is_complex() or value.is_complex():
            a, b = torch.view_as_real(value.to(torch.complex128)), torch.view_as_real(reference.to(torch.complex128))
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))  # inf against inf, NaN against NaN: no difference
        difference = torch.where(same, torch.zeros_like(a), (a - b).abs())
        difference = torch.nan_to_num(difference, nan=float("inf"))
        abs_diff = float(difference.max())
        rel_diff = float((difference / b.abs().clamp_min(1e-6)).max())
        close = bool(torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True))
        nonfinite = int((~torch.isfinite(a) | ~torch.isfinite(b)).sum())  # matched where both sides agree on them
        details[name] = {"ok": close, "abs": abs_diff, "rel": rel_diff, "shape": list(reference.shape),
                         "elements": reference.numel(), "nonfinite": nonfinite}  # fmt: skip
        max_abs, max_rel, ok = max(max_abs, abs_diff), max(max_rel, rel_diff), ok and close
    for name, count in joined_counts.items():
        details[name]["joined"] = count
    return ok, details, max_abs, max_rel


def within_eager_half_error(actual: dict, expected: dict, float32: dict, atol: float, rtol: float, details: dict) -> bool:
    """Whether each output ``compare`` failed strays from eager's float32 output no further than
    ``HALF_ERROR_MARGIN`` times eager's own error in the half dtype; notes both errors in ``details``."""
    import torch

    expected, _counts = joined_parts(actual, expected)
    float32, _counts = joined_parts(actual, float32)
    for name, detail in details.items():
        if detail["ok"] or "abs" not in detail or name not in float32:
            continue
        if (~torch.isfinite(expected[name]) & torch.isfinite(float32[name])).any():
            continue  # eager overflowed in half: no error budget to grant
        _ok, own, _abs, _rel = compare({name: expected[name]}, {name: float32[name]}, atol, rtol)
        eager_error = own[name].get("abs", math.inf)
        close, against, _abs, _rel = compare({name: actual[name]}, {name: float32[name]}, atol + HALF_ERROR_MARGIN * eager_error, rtol)
        detail.update(ok=close, float32_abs=against[name].get("abs"), eager_float32_abs=eager_error)
    return all(detail["ok"] for detail in details.values())


def new_record(cell: Cell, context: ClassContext | None = None) -> CellRecord:
    model = cell.model
    record = CellRecord(
        model_class=model.name, model_type=model.model_type, task=model.task, tasks=list(model.tasks),
        backend=cell.backend, shape_mode=cell.shape_mode, dtype=cell.dtype, started_at=now(),
        repro=f"export-sweep run --models {model.name} --backends {cell.backend} --shapes {cell.shape_mode} "
              + ("" if cell.dtype == DTYPES[0] else f"--dtypes {cell.dtype} ") + "--no-cache",
    )  # fmt: skip
    if context is not None:
        record.stages = [StageRecord(**vars(stage)) for stage in context.stages]
        record.input_set = context.input_set
        record.input_names = sorted(context.inputs.get("A", {}))
        record.modules = list(context.modules)
        record.traceback = context.traceback
    return record


def run_cell(
    cell: Cell, context: ClassContext, registry=None, on_stage: Callable[..., None] | None = None
) -> CellRecord:
    """Run one cell after the class' shared stages; ``registry`` decides skips and the ONNX optimizer.

    ``on_stage(name, ended=())`` is told before each stage starts, and within the export, as each exporter stage
    starts or ends, with the exporter stages ended so far."""
    on_stage = on_stage or (lambda name, ended=(): None)
    class_context, context = context, context.prepare(on_stage).in_dtype(cell.dtype)
    record = new_record(cell, context)
    if not context.ok:
        return _done(record)
    context.kept = context.kept or KeptState(context)
    try:
        record = _run_prepared_cell(cell, context, record, registry, on_stage)
    finally:
        start = time.perf_counter()
        changed, restored = context.kept.restore(context)
    if changed:  # a defect of ours (an exporter or the reference writing into what it was lent): later cells are safe
        if not restored:
            class_context.forget()
        record.stages.append(StageRecord(
            "shared-state", "fail", round(time.perf_counter() - start, 4), "SharedStateChanged",
            f"this cell changed what the class's later cells read: {'; '.join(changed[:5])}"
            + (f" (and {len(changed) - 5} more)" if len(changed) > 5 else "") + "; "
            + ("restored from the copy taken after eager, so later cells run on the class as built" if restored else
               "it could not be put back, so the class is built again for its next cell"),
        ))  # fmt: skip
    return _done(record)


def _run_prepared_cell(cell: Cell, context: ClassContext, record: CellRecord, registry, on_stage) -> CellRecord:
    import exporters
    from exporters.stages import watching_stages

    if registry is not None:
        skip = registry.skip_for(cell.model.name, cell.backend, cell.shape_mode)
        if skip is not None:
            record.registry = skip.as_dict()
            record.stages.append(StageRecord("registry", "skip", 0.0, "ExportSkip", f"{skip.reason} ({skip.url})"))
            return _done(record)
    if cell.shape_mode == "generate":
        return _run_generate(cell, context, record, on_stage)
    options = export_options(cell.shape_mode, context.inputs)
    if cell.backend == "onnx" and registry is not None:
        entry = registry.optimize_disabled_for(cell.model.name, cell.shape_mode)
        if entry is not None:
            options["optimize"] = False
            record.registry = entry.as_dict()
    exporter, config = exporters.exporter_for(cell.backend, **options)

    on_stage("export")
    start = time.perf_counter()

    def on_exporter_stage(name: str | None, ended: list[dict]) -> None:
        on_stage(name or "export", _exporter_stages(ended))

    try:
        with watching_stages(on_exporter_stage):
            exported = exporter.export(context.model, context.inputs["A"], config)
    except exporters.ExportError as error:
        record.stages.extend(_exporter_stages(error.stages))
        failed = _raising_stage(record.stages, error.stage)
        if failed is None:  # failed outside any stage: name it after the backend
            failed = StageRecord(f"{cell.backend}-export", "fail", 0.0)
            record.stages.append(failed)
        status, error_type, message = classify(error)
        failed.status, failed.error_type = status, error_type
        failed.message = (getattr(error, "message", None) or message)[:20000]
        record.applied = list(error.applied)
        record.traceback = getattr(error, "cause_traceback", None) or "".join(traceback.format_exception(error))
        return _done(record)
    except Exception as error:  # the exporter itself broke outside its stage bookkeeping
        stage, record.traceback = failed_stage(f"{cell.backend}-export", error, time.perf_counter() - start)
        record.stages.append(stage)
        return _done(record)
    record.stages.extend(_exporter_stages(exported.metadata["stages"]))
    record.applied = list(exported.applied)

    label = RUN_INPUT_SET[cell.shape_mode]
    if cell.shape_mode == "dynamic":
        fixed = specialized_axes(exported.metadata.get("input_shapes", {}), context.inputs["A"], context.inputs[label])
        stage = StageRecord("dynamic-axes", "fail" if fixed else "pass", 0.0)
        if fixed:
            stage.error_type = "AxisSpecialized"
            stage.message = "the exported program fixed axes the second input set varies: " + "; ".join(fixed)
        record.stages.append(stage)
        if fixed:
            return _done(record)
    steps = [
        ("load", lambda: _runtime_takes_dtype(exported.load_runtime, cell)),
        ("run", lambda: exported(**context.inputs[label])),
    ]
    outputs = None
    for name, step in steps:
        on_stage(name, record.stages[len(context.stages) :])
        stage, result, trace = run_stage(name, step)
        record.stages.append(stage)
        if stage.status != "pass":
            record.traceback = trace
            return _done(record)
        outputs = result

    on_stage("parity", record.stages[len(context.stages) :])
    atol, rtol, reason = tolerance_for(cell.model.name, cell.backend, cell.dtype)
    record.atol, record.rtol, record.tolerance_reason = atol, rtol, reason
    start = time.perf_counter()
    ok, details, max_abs, max_rel = compare(outputs, context.expected[label], atol, rtol)
    if not ok and context.float32_expected:
        ok = within_eager_half_error(outputs, context.expected[label], context.float32_expected[label], atol, rtol, details)
    record.parity, record.max_abs_diff, record.max_rel_diff = details, max_abs, max_rel
    stage = StageRecord("parity", "pass" if ok else "fail", round(time.perf_counter() - start, 4))
    if not ok:
        worst = [f"{name} ({_difference(detail, cell.dtype)})" for name, detail in details.items() if not detail["ok"]]
        stage.error_type = "ParityMismatch"
        stage.message = f"outputs differ from eager beyond atol={atol:g} rtol={rtol:g}: {', '.join(worst[:5])}"
    elif widened := [f"{name} ({_difference(detail, cell.dtype)})" for name, detail in details.items() if "float32_abs" in detail]:
        stage.message = (f"beyond atol={atol:g} from {cell.dtype} eager, but within {HALF_ERROR_MARGIN:g}x its own error "
                         f"against float32 eager: {', '.join(widened[:5])}")
    record.stages.append(stage)
    return _done(record)


def _difference(detail: dict, dtype: str) -> str:
    if "problem" in detail:
        return detail["problem"]
    if "float32_abs" not in detail:
        return "max abs %.3g" % detail["abs"]
    return (f"max abs {detail['abs']:.3g} from {dtype} eager, {detail['float32_abs']:.3g} from float32 eager, "
            f"which {dtype} eager is {detail['eager_float32_abs']:.3g} from")


# backend -> what its runtime says when it has no kernel for a dtype, the operator named in group 1: ONNX Runtime's
# CPU provider lacks many half kernels, and the ONNX standard itself gives some operators no bfloat16 (Conv)
_NO_KERNEL_FOR_DTYPE = {
    "onnx": re.compile(r"NOT_IMPLEMENTED : Could not find an implementation for (\w+)\(\d+\)"
                       r"|Type Error: Type 'tensor\((?:bfloat16|float16)\)' of input parameter \(\w+\) of operator \((\w+)\)"),
}  # fmt: skip


def _runtime_takes_dtype(load: Callable[[], Any], cell: Cell) -> Any:
    """``load()``; in a half-precision cell, a runtime without kernels for the dtype is ``unavailable``: what
    ONNX Runtime's CPU provider does not implement is no failure of the export."""
    try:
        return load()
    except Exception as error:
        pattern = _NO_KERNEL_FOR_DTYPE.get(cell.backend)
        match = pattern.search(str(error)) if pattern and cell.dtype != DTYPES[0] else None
        if match is None:
            raise
        operator = next(group for group in match.groups() if group)
        raise StageFailure(
            "unavailable", f"the {cell.backend} runtime runs no {cell.dtype} {operator} on this CPU: "
            f"{str(error).strip()[:300]}", "RuntimeDtypeUnsupported",
        ) from error  # fmt: skip


GENERATED_TOKENS = 8


def _run_generate(cell: Cell, context: ClassContext, record: CellRecord, on_stage) -> CellRecord:
    """Prefill and decode programs, a greedy loop through them in the backend's runtime, tokens against eager's."""
    from exporters.generation import compare_generation, eager_generate, export_for_generation, generation_prompt

    prompt = generation_prompt(context.model, context.inputs["A"])
    results: dict = {}
    steps = [
        ("reference", lambda: results.setdefault("eager", eager_generate(context.model, prompt, GENERATED_TOKENS))),
        ("export", lambda: results.setdefault("generator", export_for_generation(context.model, prompt, cell.backend))),
        ("load", lambda: results["generator"].load_runtime()),
        ("run", lambda: results.setdefault("generated", results["generator"].generate(prompt, GENERATED_TOKENS))),
    ]
    for name, step in steps:
        on_stage(name)
        stage, _result, trace = run_stage(name, step)
        record.stages.append(stage)
        if name == "export" and "generator" in results:
            record.applied = results["generator"].applied
        if stage.status != "pass":
            record.traceback = trace
            return _done(record)
    on_stage("parity")
    atol, rtol, reason = tolerance_for(cell.model.name, cell.backend, cell.dtype)
    record.atol, record.rtol, record.tolerance_reason = atol, rtol, reason
    comparison = compare_generation(results["eager"], results["generated"], atol, rtol)
    record.max_abs_diff = comparison.max_abs_diff
    record.parity = {"generation": {**comparison.as_dict(), "ok": comparison.ok, "abs": comparison.max_abs_diff,
                                    "tokens": results["generated"].tokens.tolist(),
                                    "eager_tokens": results["eager"].tokens.tolist()}}  # fmt: skip
    stage = StageRecord("parity", "pass" if comparison.ok else "fail", 0.0, details={"note": comparison.message})
    if not comparison.ok:
        stage.error_type, stage.message = "GenerationMismatch", comparison.message
    elif not comparison.tokens_equal:
        stage.message = comparison.message  # a near-tie: shown, not failed
    record.stages.append(stage)
    return _done(record)


def export_options(shape_mode: str, inputs: dict) -> dict:
    """The exporter options of a ``shape_mode`` cell: a dynamic one varies the axes its two input sets differ on."""
    options = {"dynamic": shape_mode == "dynamic"}
    if shape_mode == "dynamic":
        options["dynamic_shapes"] = varying_axes(inputs["A"], inputs["B"])
    return options


def varying_axes(first: dict, second: dict) -> dict | None:
    """``Dim.AUTO`` on the axes that differ between the two input sets (batch, sequence), static elsewhere.

    A user marks the axes they will vary; marking every axis of an image makes torch.export reason symbolically
    about convolution arithmetic it never needs. None (every axis) when an input is not a plain tensor.
    """
    import torch

    shapes = {}
    for name, value in first.items():
        other = second.get(name)
        if not isinstance(value, torch.Tensor) or not isinstance(other, torch.Tensor) or value.dim() != other.dim():
            return None
        shapes[name] = {axis: torch.export.Dim.AUTO for axis in range(value.dim()) if value.shape[axis] != other.shape[axis]}
    return shapes


def specialized_axes(program_shapes: dict[str, list], first: dict, second: dict) -> list[str]:
    """The input axes the export fixed to a number although ``second`` gives them another size (a guard in the
    model specialised them), as readable ``name axis 1 = 7 (second set: 9)``."""
    from exporters.leaves import named_leaves

    first, second = named_leaves(first), named_leaves(second)
    fixed = []
    for name, shape in program_shapes.items():
        if name not in first or name not in second:
            continue
        for axis, size in enumerate(shape):
            other = second[name].shape[axis] if axis < second[name].dim() else None
            if isinstance(size, int) and other is not None and other != size:
                fixed.append(f"{name} axis {axis} = {size} (second set: {other})")
    return fixed


def _exporter_stages(stages: list[dict]) -> list[StageRecord]:
    return [StageRecord(stage["name"], stage["status"], stage["seconds"]) for stage in stages]


def _raising_stage(stages: list[StageRecord], name: str) -> StageRecord | None:
    """The failing stage an export error names: the innermost that raised (torch.onnx's decompositions run inside
    its translation, which fails with them); else the last failing one."""
    failing = [stage for stage in stages if stage.status == "fail"]
    return next((stage for stage in reversed(failing) if stage.name == name), failing[-1] if failing else None)


def _done(record: CellRecord) -> CellRecord:
    record.finished_at = now()
    return record.finish()
