"""The known-issue lists, read from and written to a TOML data file that keeps its comments and order.

Two lists, each entry naming a model class, a scope, a reason and the upstream issue or PR it waits on:

- ``EXPORT_SKIPS``: cells not run, because the model is not exportable as it stands;
- ``ONNX_DISABLE_OPTIMIZE``: ONNX cells exported without the onnxscript optimizer, because of an optimizer bug.

A scope is ``all``, a shape mode (``static``, ``dynamic``, ``generate``), a backend, or ``<backend>.<shape>``.
``fixed_when`` (optional, like ``onnxscript>0.7.2``) says which installed version should make the entry stale.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from exporters.backends import BACKENDS

LISTS = ("EXPORT_SKIPS", "ONNX_DISABLE_OPTIMIZE")
SHAPES = ("static", "dynamic", "generate")
SCOPES = ("all", *SHAPES, *BACKENDS, *(f"{backend}.{shape}" for backend in BACKENDS for shape in SHAPES))
ONNX_SCOPES = ("all", *SHAPES, "onnx", *(f"onnx.{shape}" for shape in SHAPES))
FIELDS = ("model", "scope", "reason", "url", "fixed_when")
REQUIRED = ("model", "scope", "reason", "url")
DEFAULT_PATH = Path(__file__).with_name("known_issues.toml")
_URL = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull|discussions)/\d+(#[\w-]+)?$")
_REQUIREMENT = re.compile(r"^([A-Za-z][\w.-]*)\s*(==|!=|>=|<=|>|<|~=)\s*([\w.+-]+)$")
_HEADER = re.compile(r"^\s*\[\[\s*([A-Za-z_]+)\s*\]\]\s*(#.*)?$")


class RegistryError(ValueError):
    """The registry file is malformed; the message names file, line and entry."""


@dataclass(frozen=True)
class Entry:
    list: str
    model: str
    scope: str
    reason: str
    url: str
    fixed_when: str | None = None
    line: int = 0  # where its [[LIST]] header is, in the file it came from

    def covers(self, backend: str, shape: str) -> bool:
        scope = self.scope
        if scope == "all":
            return True
        if scope in SHAPES:
            return scope == shape
        if "." in scope:
            return scope == f"{backend}.{shape}"
        return scope == backend

    def as_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}

    def label(self) -> str:
        return f"{self.list} {self.model} [{self.scope}]"


@dataclass
class Problem:
    """A validation finding: where, which entry, what."""

    path: Path
    line: int
    entry: str
    message: str
    kind: str = "error"  # error | vanished

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.entry}: {self.message}"


class Registry:
    def __init__(self, path: Path, entries: list[Entry], text: str):
        self.path, self.entries, self.text = path, entries, text

    # ── reading ──
    @classmethod
    def load(cls, path: str | Path | None = None) -> Registry:
        """Parse and check the shape of every entry (class existence is ``check``'s job: it needs transformers)."""
        path = Path(path) if path else DEFAULT_PATH
        try:
            text = path.read_text()
        except OSError as error:
            raise RegistryError(f"{path}: cannot read the registry ({error})") from None
        return cls.parse(path, text)

    @classmethod
    def parse(cls, path: Path, text: str) -> Registry:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise RegistryError(f"{path}: not valid TOML: {error}") from None
        headers = [(number, match.group(1)) for number, line in enumerate(text.splitlines(), 1) if (match := _HEADER.match(line))]
        unknown = [(number, name) for number, name in headers if name not in LISTS]
        if unknown or set(data) - set(LISTS):
            number, name = unknown[0] if unknown else (1, sorted(set(data) - set(LISTS))[0])
            raise RegistryError(f"{path}:{number}: unknown list {name!r}: expected one of {', '.join(LISTS)}")
        lines = {name: [number for number, header in headers if header == name] for name in LISTS}
        entries, problems = [], []
        for name in LISTS:
            tables = data.get(name, [])
            if not isinstance(tables, list):
                raise RegistryError(f"{path}: {name} must be written as [[{name}]] tables")
            for table, line in zip(tables, lines[name]):
                entry, found = _entry(path, name, table, line)
                problems.extend(found)
                if entry is not None:
                    entries.append(entry)
        problems.extend(_duplicates_and_contradictions(path, entries))
        if problems:
            raise RegistryError("\n".join(str(problem) for problem in problems))
        return cls(path, entries, text)

    def lists(self) -> dict[str, dict[str, dict[str, Entry]]]:
        """``{list: {scope: {model: entry}}}``."""
        result: dict[str, dict[str, dict[str, Entry]]] = {name: {} for name in LISTS}
        for entry in self.entries:
            result[entry.list].setdefault(entry.scope, {})[entry.model] = entry
        return result

    def skip_for(self, model: str, backend: str, shape: str) -> Entry | None:
        return next((e for e in self.entries if e.list == "EXPORT_SKIPS" and e.model == model and e.covers(backend, shape)), None)

    def optimize_disabled_for(self, model: str, shape: str) -> Entry | None:
        return next(
            (e for e in self.entries if e.list == "ONNX_DISABLE_OPTIMIZE" and e.model == model and e.covers("onnx", shape)),
            None,
        )

    def cells_of(self, entry: Entry, backends=BACKENDS, shapes=SHAPES) -> list[tuple[str, str]]:
        """The (backend, shape) cells an entry governs."""
        backends = ("onnx",) if entry.list == "ONNX_DISABLE_OPTIMIZE" else backends
        return [(backend, shape) for backend in backends for shape in shapes if entry.covers(backend, shape)]

    # ── validation against the installed transformers ──
    def check(self, known_classes) -> list[Problem]:
        from harness.models import near_matches

        known_classes = set(known_classes)
        problems = []
        for entry in self.entries:
            if entry.model not in known_classes:
                hint = near_matches(entry.model, known_classes)
                problems.append(
                    Problem(
                        self.path, entry.line, entry.label(),
                        "vanished: no such class in the installed transformers"
                        + (f" (near: {', '.join(hint)})" if hint else ""),
                        kind="vanished",
                    )
                )  # fmt: skip
        return problems

    # ── writing ──
    def add(self, entry: Entry, known_classes=None) -> Entry:
        """Append a validated entry to the file, leaving everything already there untouched."""
        lines = [f"\n[[{entry.list}]]"]
        for key in FIELDS:
            value = getattr(entry, key)
            if value is not None:
                lines.append(f"{key} = {_toml_string(value)}")
        text = self.text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
        candidate = Registry.parse(self.path, text)  # refuses what validation would reject
        if known_classes is not None:
            problems = [p for p in candidate.check(known_classes) if p.entry == entry.label()]
            if problems:
                raise RegistryError("\n".join(str(problem) for problem in problems))
        self.path.write_text(text)
        self.text, self.entries = text, candidate.entries
        return next(e for e in candidate.entries if e.list == entry.list and e.model == entry.model and e.scope == entry.scope)

    def without(self, remove: list[Entry]) -> str:
        """The file's text without these entries: each one's block, from its header to the next, goes; comments
        directly above it that belong to it go too; every other line stays as it was."""
        lines = self.text.splitlines(keepends=True)
        headers = sorted(entry.line for entry in self.entries)
        doomed: set[int] = set()
        for entry in remove:
            start = entry.line
            following = [line for line in headers if line > start]
            end = (following[0] - 1) if following else len(lines)
            # stop before comments or blank lines that lead into the next block
            while end > start and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
                end -= 1
            # comments glued above the header belong to the entry
            first = start
            while first > 1 and lines[first - 2].lstrip().startswith("#") and lines[first - 2].strip() != "#":
                first -= 1
            doomed.update(range(first, end + 1))
            if first > 1 and not lines[first - 2].strip() and (end >= len(lines) or not lines[end].strip()):
                doomed.add(first - 1)  # one blank line of the two around the block
        return "".join(line for number, line in enumerate(lines, 1) if number not in doomed)


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _entry(path: Path, name: str, table: dict, line: int) -> tuple[Entry | None, list[Problem]]:
    label = f"{name} {table.get('model', '?')} [{table.get('scope', '?')}]"
    problems = []

    def problem(message):
        problems.append(Problem(path, line, label, message))

    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        problem(f"unknown field {unknown[0]!r}: fields are {', '.join(FIELDS)}")
    for key in REQUIRED:
        value = table.get(key)
        if not isinstance(value, str) or not value.strip():
            problem(f"{key} is missing or empty")
    scope = table.get("scope")
    allowed = ONNX_SCOPES if name == "ONNX_DISABLE_OPTIMIZE" else SCOPES
    if isinstance(scope, str) and scope and scope not in allowed:
        problem(f"unknown scope {scope!r}: expected one of {', '.join(allowed)}")
    url = table.get("url")
    if isinstance(url, str) and url and not _URL.match(url):
        problem(f"url {url!r} is not a GitHub issue, pull request or discussion link (https://github.com/o/r/issues/N)")
    fixed_when = table.get("fixed_when")
    if fixed_when is not None and (not isinstance(fixed_when, str) or not _REQUIREMENT.match(fixed_when)):
        problem(f"fixed_when {fixed_when!r} is not a version condition like 'onnxscript>0.7.2'")
    if problems:
        return None, problems
    return Entry(name, table["model"], scope, table["reason"].strip(), url, fixed_when, line), []


def _duplicates_and_contradictions(path: Path, entries: list[Entry]) -> list[Problem]:
    problems = []
    seen: dict[tuple, Entry] = {}
    for entry in entries:
        key = (entry.list, entry.model, entry.scope)
        if key in seen:
            problems.append(Problem(path, entry.line, entry.label(), f"duplicate of the entry at line {seen[key].line}"))
            continue
        seen[key] = entry
    cells = {(b, s) for b in BACKENDS for s in SHAPES}
    by_model: dict[tuple, list[Entry]] = {}
    for entry in seen.values():
        by_model.setdefault((entry.list, entry.model), []).append(entry)
    for (name, model), group in by_model.items():
        for i, first in enumerate(group):
            for second in group[i + 1 :]:
                overlap = {c for c in cells if first.covers(*c) and second.covers(*c)}
                if name == "ONNX_DISABLE_OPTIMIZE":
                    overlap = {c for c in overlap if c[0] == "onnx"}
                if overlap:
                    problems.append(
                        Problem(path, second.line, second.label(), f"overlaps the entry at line {first.line} ({first.scope})")
                    )
    for entry in seen.values():
        if entry.list != "ONNX_DISABLE_OPTIMIZE":
            continue
        governed = {("onnx", s) for s in SHAPES if entry.covers("onnx", s)}
        skipped = {c for c in governed for skip in seen.values() if skip.list == "EXPORT_SKIPS" and skip.model == entry.model and skip.covers(*c)}
        if governed and governed == skipped:
            problems.append(
                Problem(path, entry.line, entry.label(), "contradicts EXPORT_SKIPS: every cell it governs is skipped")
            )
    return problems


def version_reached(entry: Entry, versions: dict[str, str | None]) -> bool | None:
    """Whether the installed versions satisfy ``fixed_when``; None when there is no condition or no such package."""
    if not entry.fixed_when:
        return None
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    package, operator, version = _REQUIREMENT.match(entry.fixed_when).groups()
    installed = versions.get(package)
    if installed is None:
        return None
    return Version(installed.split("+")[0]) in SpecifierSet(f"{operator}{version}")
