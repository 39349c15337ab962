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
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

from exporters.backends import BACKENDS
from exporters.versions import condition_holds, is_version_condition
from harness.store import write_text_atomic

LISTS = ("EXPORT_SKIPS", "ONNX_DISABLE_OPTIMIZE")
SHAPES = ("static", "dynamic", "generate")
SCOPES = ("all", *SHAPES, *BACKENDS, *(f"{backend}.{shape}" for backend in BACKENDS for shape in SHAPES))
ONNX_SCOPES = ("all", *SHAPES, "onnx", *(f"onnx.{shape}" for shape in SHAPES))
FIELDS = ("model", "scope", "reason", "url", "fixed_when")
REQUIRED = ("model", "scope", "reason", "url")
DEFAULT_PATH = Path(__file__).with_name("known_issues.toml")
_URL = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull|discussions)/\d+(#[\w-]+)?$")
_HEADER = re.compile(r"^\s*\[\[\s*([A-Za-z_]+)\s*\]\]\s*(#.*)?$")
# What a TOML basic string needs escaped: the quote, the backslash, the control characters (tab too, for one rule)
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", **{chr(c): f"\\u{c:04X}" for c in [*range(0x20), 0x7F]}}


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
            data = path.read_bytes()
        except OSError as error:
            raise RegistryError(f"{path}: cannot read the registry ({error})") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data[: error.start].count(b"\n") + 1
            raise RegistryError(f"{path}:{line}: not UTF-8 (byte 0x{data[error.start]:02x}): save the registry as "
                                "UTF-8, as TOML requires") from None  # fmt: skip
        return cls.parse(path, text.replace("\r\n", "\n").replace("\r", "\n"))  # newlines as read_text gives them

    @classmethod
    def parse(cls, path: Path, text: str) -> Registry:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise RegistryError(f"{path}: not valid TOML: {error}") from None
        lines = _lines(text)
        headers = [(number, match.group(1)) for number, line in enumerate(lines, 1) if (match := _HEADER.match(line))]
        unknown = [(number, name) for number, name in headers if name not in LISTS]
        others = sorted(set(data) - set(LISTS))
        if unknown or others:
            number, name = unknown[0] if unknown else ((_mention(lines, others[0], set()) or (1,))[0], others[0])
            raise RegistryError(f"{path}:{number}: unknown list {name!r}: expected one of {', '.join(LISTS)}")
        entries, problems = [], []
        for name in LISTS:
            tables = data.get(name, [])
            numbers = [number for number, header in headers if header == name]
            _refuse_other_shapes(path, lines, name, tables, numbers)
            for table, line in zip(tables, numbers):
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
        self.save(text)
        self.text, self.entries = text, candidate.entries
        return next(e for e in candidate.entries if e.list == entry.list and e.model == entry.model and e.scope == entry.scope)

    def save(self, text: str) -> None:
        """Replace the file with ``text`` atomically: when the write fails (a full disk), the file stays as it was."""
        try:
            write_text_atomic(self.path.resolve(), text)  # resolved: through a symlink, as an edit in place would
        except OSError as error:
            raise RegistryError(f"{self.path}: cannot write the registry ({error.strerror or error}); "
                                "it is left as it was") from None  # fmt: skip

    def without(self, remove: list[Entry]) -> str:
        """The file's text without these entries: each one's block, from its header to the next, goes; comments
        directly above it that belong to it go too; every other line stays as it was."""
        lines = _lines(self.text)
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
    """A TOML basic string. A control character is escaped, not written as it is: the file stays valid TOML, so the
    check of the entry can refuse the character by its field instead of calling the whole file broken."""
    return '"' + "".join(_TOML_ESCAPES.get(character, character) for character in value) + '"'


def _lines(text: str) -> list[str]:
    """The lines of a TOML text, each with its newline. Only "\\n" ends a TOML line: ``str.splitlines`` also ends one
    at U+0085 or U+2028, which a comment may hold, and every line number after it would be wrong."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _mention(lines: list[str], name: str, headers: set[int]) -> tuple[int, str] | None:
    """The first line, other than the ``[[name]]`` header lines, that writes ``name`` as a key or a table, and how."""
    pattern = re.compile(rf"""^\s*(\[\[|\[)?\s*(["']?){re.escape(name)}\2\s*(\]|=|\.)""")
    for number, line in enumerate(lines, 1):
        if number not in headers and (match := pattern.match(line)):
            bracket, _, after = match.groups()
            if after == ".":
                return number, "with dotted keys"
            return number, {"[[": "with a quoted header", "[": "as a single [table]"}.get(bracket, "as an inline array")
    return None


def _refuse_other_shapes(path: Path, lines: list[str], name: str, value, headers: list[int]) -> None:
    """Refuse a list written other than as ``[[name]]`` tables, each header alone on its line (an inline array, a
    single table, dotted keys, a quoted header): its entries would have no line number, or be dropped unseen."""
    mention = _mention(lines, name, set(headers))
    tables = isinstance(value, list) and all(isinstance(table, dict) for table in value)
    if tables and len(value) == len(headers) and (mention is None or not value):
        return  # as [[name]] tables, or an empty list: nothing unseen
    if mention is None:  # more header lines than tables: one sits where TOML does not read a header
        count = len(value) if tables else 0
        mention = (headers[min(count, len(headers) - 1)] if headers else 1,
                   f"with {count} entries for {len(headers)} [[{name}]] header lines")  # fmt: skip
    line, shape = mention
    raise RegistryError(f"{path}:{line}: {name} is written {shape}: write each entry as a [[{name}]] table, its "
                        "header alone on its line, so that every entry is read and has a line number")  # fmt: skip


def _unfit_character(value: str) -> str | None:
    """The first character a one-line text field must not hold, described; None when there is none."""
    for character in value:
        category = unicodedata.category(character)
        if category == "Cc":
            return f"the control character U+{ord(character):04X}"
        if category in ("Zl", "Zp"):
            return f"the line separator U+{ord(character):04X}"
        if category == "Cs":
            return f"U+{ord(character):04X}, which is not a character (bytes that are not UTF-8?)"
    return None


def _printable(value) -> str:
    """``value`` as text safe to print: a control character in a message would act on the terminal."""
    return "".join(character if character.isprintable() else f"\\u{ord(character):04x}" for character in str(value))


def _entry(path: Path, name: str, table: dict, line: int) -> tuple[Entry | None, list[Problem]]:
    label = f"{name} {_printable(table.get('model', '?'))} [{_printable(table.get('scope', '?'))}]"
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
    for key in FIELDS:
        value = table.get(key)
        if isinstance(value, str) and (character := _unfit_character(value)):
            problem(f"{key} contains {character}: every field is plain one-line text")
    scope = table.get("scope")
    allowed = ONNX_SCOPES if name == "ONNX_DISABLE_OPTIMIZE" else SCOPES
    if isinstance(scope, str) and scope and scope not in allowed:
        problem(f"unknown scope {scope!r}: expected one of {', '.join(allowed)}")
    url = table.get("url")
    if isinstance(url, str) and url and not _URL.match(url):
        problem(f"url {url!r} is not a GitHub issue, pull request or discussion link (https://github.com/o/r/issues/N)")
    fixed_when = table.get("fixed_when")
    if fixed_when is not None and not is_version_condition(fixed_when):
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
    return condition_holds(entry.fixed_when, versions)
