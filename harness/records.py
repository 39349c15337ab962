"""The cell record: the one contract between the harness and everything that reads a run (reports, outside tools).

A cell is one (model class, backend, shape mode). Its record lists every stage it ran, in order, and names the
furthest stage as its headline. Keep the flat fields stable: ``harness.load_run`` turns them into DataFrame columns.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields

from exporters.backends import BACKENDS

SHAPE_MODES = ("static", "dynamic", "generate")
STATUSES = ("pass", "fail", "skip", "timeout", "crash", "oom", "unavailable")
# Stages every cell shares before its backend's own, and after them.
SHARED_STAGES = ("config", "build", "eager")
RUNTIME_STAGES = ("load", "run", "parity")
DEFAULT_TOLERANCE = {"dynamo": 1e-4, "onnx": 1e-3, "executorch": 1e-3}
SCHEMA_VERSION = 1


def cell_id(model_class: str, backend: str, shape_mode: str) -> str:
    return f"{model_class}-{backend}-{shape_mode}"


@dataclass
class StageRecord:
    name: str
    status: str
    seconds: float = 0.0
    error_type: str | None = None
    message: str | None = None
    details: dict = field(default_factory=dict)


@dataclass
class CellRecord:
    model_class: str
    model_type: str
    task: str
    backend: str
    shape_mode: str
    status: str = "pass"
    stage: str = ""  # the stage that failed, or the last one reached
    seconds: float = 0.0
    stages: list[StageRecord] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    error_type: str | None = None
    message: str | None = None
    error_signature: str | None = None
    traceback: str | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    atol: float | None = None
    rtol: float | None = None
    tolerance_reason: str | None = None  # why this class needs a wider tolerance than the backend default
    parity: dict = field(default_factory=dict)  # output name -> {abs, rel, shape, ok}
    input_set: str | None = None  # which inputs fed the model: "text", "text+image", ...
    input_names: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # workarounds that fired
    registry: dict | None = None  # the EXPORT_SKIPS / ONNX_DISABLE_OPTIMIZE entry that applied
    reused: bool = False  # copied from an earlier run whose inputs were identical
    cache_key: str | None = None
    repro: str | None = None
    worker: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    peak_rss_mb: float | None = None
    schema: int = SCHEMA_VERSION

    @property
    def cell_id(self) -> str:
        return cell_id(self.model_class, self.backend, self.shape_mode)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CellRecord:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown record fields: {', '.join(unknown)}")
        stages = [StageRecord(**stage) for stage in data.get("stages", [])]
        return cls(**{**data, "stages": stages})

    def finish(self) -> CellRecord:
        """Set the headline fields from the stages: the first non-passing stage decides status and stage."""
        self.seconds = round(sum(stage.seconds for stage in self.stages), 4)
        failing = [stage for stage in self.stages if stage.status != "pass"]
        # an outer stage fails with the inner one that raised (torch.onnx's translation runs inside our
        # decompositions hook): the one holding the error is the one that failed
        failed = next((stage for stage in failing if stage.error_type), failing[0] if failing else None)
        if failed is None:
            self.status, self.stage = "pass", self.stages[-1].name if self.stages else ""
            self.error_type = self.message = self.error_signature = None
        else:
            self.status, self.stage = failed.status, failed.name
            self.error_type, self.message = failed.error_type, failed.message
            self.error_signature = error_signature(failed.name, failed.error_type, failed.message)
        return self


# ── Error signatures: the same failure in two models reads the same ──────────

_SIGNATURE_RULES = [
    (re.compile(r"\x1b\[[0-9;]*m"), ""),  # terminal colours (torch.onnx's messages)
    (re.compile(r"/[\w./-]+\.(py|cpp|h)"), "<file>"),  # paths
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "<addr>"),  # addresses; short codes (ExecuTorch's 0x12) stay
    (re.compile(r"(?<![\w.])(?!0x)\d+(?:x\d+)+(?![\w])"), "<shape>"),  # 48x64, not 0x12
    (re.compile(r"'[^']{40,}'|\"[^\"]{40,}\""), "<str>"),  # long quoted literals
    (re.compile(r"\b[A-Z][A-Za-z0-9]*(?:For[A-Z]\w*|Model|Config|Layer|Attention|Block|Encoder|Decoder)\b"), "<Cls>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?(e[-+]?\d+)?(?![\w])"), "<n>"),  # numbers
    (re.compile(r"\b[us]\d+\b"), "<sym>"),  # unbacked/backed symbols u0, s12
    (re.compile(r"\s+"), " "),
]


def error_signature(stage: str, error_type: str | None, message: str | None) -> str:
    """A normalized one-line key for bucketing: numbers, paths, class names and shapes become placeholders."""
    lines = [line.strip() for line in (message or "").strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    # Exporters prefix "[backend:stage] Type: "; the bucket already has both.
    if re.match(r"^\[[\w-]+:[\w-]+\]", first):  # "[onnx:run] TypeName: message" from an exporter
        first = re.sub(r"^\[[\w-]+:[\w-]+\]\s*(\w+:\s*)?", "", first)
    first = re.sub(r"^\w+(Error|Exception)\w*:\s*", "", first)
    if error_type and first.startswith(f"{error_type}:"):  # types not named *Error (GuardOnDataDependentSymNode)
        first = first[len(error_type) + 1 :].lstrip()
    if not first.strip(": ") and len(lines) > 1:  # "SpecViolationError:" alone: the reason is on the next line
        first = lines[1]
    for pattern, replacement in _SIGNATURE_RULES:
        first = pattern.sub(replacement, first)
    return f"{stage}: {error_type or 'Error'}: {first.strip()[:200]}"
