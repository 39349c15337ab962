"""The cell record: the one contract between the harness and everything that reads a run (reports, outside tools).

A cell is one (model class, backend, shape mode, dtype). Its record lists every stage it ran, in order, and names the
furthest stage as its headline. Keep the flat fields stable: ``harness.load_run`` turns them into DataFrame columns.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields

from exporters.backends import BACKENDS

SHAPE_MODES = ("static", "dynamic", "generate")
# the first is the default: its cells keep three-part ids, `<class>-<backend>-<shape>`; others add `-<dtype>`
DTYPES = ("float32", "bfloat16", "float16")
STATUSES = ("pass", "fail", "skip", "timeout", "crash", "oom", "unavailable")
# Stages every cell shares before its backend's own, and after them.
SHARED_STAGES = ("config", "build", "eager")
RUNTIME_STAGES = ("load", "run", "parity")
DEFAULT_TOLERANCE = {"dynamo": 1e-4, "onnx": 1e-3, "executorch": 1e-3}
SCHEMA_VERSION = 1


def cell_id(model_class: str, backend: str, shape_mode: str, dtype: str = DTYPES[0]) -> str:
    return f"{model_class}-{backend}-{shape_mode}" + ("" if dtype == DTYPES[0] else f"-{dtype}")


def parse_cell_id(text: str) -> tuple[str, str, str, str]:
    """``(model class, backend, shape mode, dtype)`` of a cell id (class names hold no dash)."""
    model, backend, shape, *dtype = text.split("-")
    return model, backend, shape, dtype[0] if dtype else DTYPES[0]


def column_of(shape_mode: str, dtype: str = DTYPES[0]) -> str:
    """A dashboard column's mode: the shape mode, and the dtype unless it is the default (``static-bfloat16``)."""
    return shape_mode if dtype == DTYPES[0] else f"{shape_mode}-{dtype}"


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
    dtype: str = DTYPES[0]
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
    modules: list[str] = field(default_factory=list)  # the transformers modules its model is built from
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
        return cell_id(self.model_class, self.backend, self.shape_mode, self.dtype)

    @property
    def mode(self) -> str:
        return column_of(self.shape_mode, self.dtype)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CellRecord:
        """A record read back from JSON, every field checked for its type: a record that would mislead a report (a
        status that is no status, a number that is text) is refused with the field named."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown record fields: {', '.join(unknown)}")
        absent = [name for name in REQUIRED_FIELDS if name not in data]
        if absent:
            raise ValueError(f"missing record fields: {', '.join(absent)}")
        _check_fields(data, _RECORD_TYPES, "")
        if not isinstance(data["stages"], list):
            raise ValueError(f"field 'stages' must be a list, found {_shown(data['stages'])}")
        for index, stage in enumerate(data["stages"]):
            if not isinstance(stage, dict):
                raise ValueError(f"field 'stages[{index}]' must be an object, found {_shown(stage)}")
            unknown = sorted(set(stage) - set(_STAGE_TYPES))
            if unknown or "name" not in stage or "status" not in stage:
                raise ValueError(f"field 'stages[{index}]' must have name and status, and only "
                                 f"{', '.join(_STAGE_TYPES)}")  # fmt: skip
            _check_fields(stage, _STAGE_TYPES, f"stages[{index}].")
        stages = [StageRecord(**stage) for stage in data["stages"]]
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


# ── The record's schema, checked on read ─────────────────────────────────────

REQUIRED_FIELDS = ("model_class", "model_type", "backend", "shape_mode", "status", "stage", "stages", "seconds")
_TEXT, _NUMBER, _FLAG = (str,), (int, float), (bool,)
_OPTIONAL_TEXT, _OPTIONAL_NUMBER = (str, type(None)), (int, float, type(None))
_RECORD_TYPES = {
    "model_class": _TEXT, "model_type": _TEXT, "task": _TEXT, "backend": _TEXT, "shape_mode": _TEXT,
    "dtype": _TEXT, "status": _TEXT, "stage": _TEXT, "seconds": _NUMBER, "stages": (list,), "tasks": (list,),
    "error_type": _OPTIONAL_TEXT, "message": _OPTIONAL_TEXT, "error_signature": _OPTIONAL_TEXT,
    "traceback": _OPTIONAL_TEXT, "max_abs_diff": _OPTIONAL_NUMBER, "max_rel_diff": _OPTIONAL_NUMBER,
    "atol": _OPTIONAL_NUMBER, "rtol": _OPTIONAL_NUMBER, "tolerance_reason": _OPTIONAL_TEXT, "parity": (dict,),
    "input_set": _OPTIONAL_TEXT, "input_names": (list,), "applied": (list,), "modules": (list,), "registry": (dict, type(None)),
    "reused": _FLAG, "cache_key": _OPTIONAL_TEXT, "repro": _OPTIONAL_TEXT, "worker": _OPTIONAL_TEXT,
    "started_at": _OPTIONAL_TEXT, "finished_at": _OPTIONAL_TEXT, "peak_rss_mb": _OPTIONAL_NUMBER, "schema": (int,),
}  # fmt: skip
_STAGE_TYPES = {"name": _TEXT, "status": _TEXT, "seconds": _NUMBER, "error_type": _OPTIONAL_TEXT,
                "message": _OPTIONAL_TEXT, "details": (dict,)}  # fmt: skip
_VOCABULARIES = {"status": STATUSES, "backend": BACKENDS, "shape_mode": SHAPE_MODES, "dtype": DTYPES}
_TEXT_LISTS = ("tasks", "input_names", "applied", "modules")


def _shown(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _check_fields(data: dict, types: dict, prefix: str) -> None:
    for name, value in data.items():
        allowed = types[name]
        # bool is an int to Python, never a number or a name in a record
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            kinds = " or ".join("null" if kind is type(None) else kind.__name__ for kind in allowed)
            raise ValueError(f"field '{prefix}{name}' must be {kinds}, found {_shown(value)}")
        if name in _VOCABULARIES and value not in _VOCABULARIES[name]:
            raise ValueError(f"field '{prefix}{name}' is {value!r}: expected one of {', '.join(_VOCABULARIES[name])}")
        if name in _TEXT_LISTS and not all(isinstance(item, str) for item in value):
            raise ValueError(f"field '{prefix}{name}' must be a list of text, found {_shown(value)}")
        if name == "parity" and not all(isinstance(detail, dict) for detail in value.values()):
            raise ValueError(f"field '{prefix}parity' must map each output to an object, found {_shown(value)}")


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
