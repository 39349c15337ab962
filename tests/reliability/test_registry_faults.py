"""Faults injected into the registry: a full disk while it is written, entries TOML holds in a shape the parser
did not look for, control characters in a field, and a stale check asked to run with no worker.

A full disk is a real child process whose file size limit (RLIMIT_FSIZE) is below what it must write, with SIGXFSZ
ignored so the write fails with EFBIG as it does on a full disk, instead of killing the process.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from registry import Entry, Registry, RegistryError
from registry.stale import rerun_governed_cells

ROOT = Path(__file__).resolve().parents[2]
URL = "https://github.com/pytorch/pytorch/issues/1"
# Comments that make a registry larger than the file size limit of the tests below
PADDING = "".join(f"# note {n}: a comment that pads the registry past the file size limit\n" for n in range(12))
BERT = f'\n[[EXPORT_SKIPS]]\nmodel = "BertModel"\nscope = "dynamo.static"\nreason = "pretend it fails"\nurl = "{URL}"\n'
INLINE = f'{{model = "BertModel", scope = "onnx", reason = "r", url = "{URL}"}}'  # one entry as an inline table
GPT2 = f'\n[[EXPORT_SKIPS]]\nmodel = "GPT2Model"\nscope = "onnx"\nreason = "keeps"\nurl = "{URL}"\n'


def _file_size_limit(size: int):
    """A ``preexec_fn``: the child may write files of at most ``size`` bytes, and a larger write fails (EFBIG)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return limit


def _run(command, size: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # no .pyc written under the limit
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=timeout,
                          preexec_fn=_file_size_limit(size) if size else None)  # fmt: skip


def _cli_add(path: Path, reason, model="GPT2Model") -> list:
    return [sys.executable, "-m", "commands", "registry", "add", "--registry", str(path), "--list", "EXPORT_SKIPS",
            "--scope", "onnx", "--model", model, "--reason", reason, "--url", URL]  # fmt: skip


def _leftovers(folder: Path, *keep: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path not in keep)


# ── a full disk: the registry, stale.json and the GitHub cache stay whole ──


def test_registry_add_on_a_full_disk_leaves_the_registry_byte_identical_with_a_one_line_error(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(PADDING + BERT)
    before = path.read_bytes()
    assert 900 < len(before) < 1024, "the registry fits under the limit, the entry added to it does not"
    result = _run(_cli_add(path, "pretend it fails too"), size=1024)
    stderr = result.stderr.decode()
    assert path.read_bytes() == before
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert str(path) in stderr and "File too large" in stderr
    assert _leftovers(tmp_path, path) == [], "no temporary file is left beside the registry"
    Registry.load(path)


STALE_SNIPPET = """
import sys
from types import SimpleNamespace

import commands.known_issues as known_issues
from registry import RegistryError

def rerun_where_everything_passes(registry, out, jobs, timeout):
    def rerun(entries):
        record = SimpleNamespace(status="pass", cell_id="cell", stage="parity", max_abs_diff=0.0)
        return {{entry.label(): [record] for entry in entries}}
    return rerun

known_issues.rerun_governed_cells = rerun_where_everything_passes  # every entry passes now: --fix rewrites
args = SimpleNamespace(registry={registry!r}, models="all", model_types=None, tasks=None, limit=None,
                       cache_dir={cache!r}, offline=True, out={out!r}, jobs=1, timeout=60.0, json={json!r},
                       fix=True, strict=False, run=None, workarounds=False)
try:
    known_issues.cmd_stale(args)
except RegistryError as error:
    print(f"stale: {{error}}", file=sys.stderr)
    sys.exit(2)
"""


def _stale_fix(tmp_path: Path, registry: Path, json_path: Path, size: int) -> subprocess.CompletedProcess:
    snippet = STALE_SNIPPET.format(registry=str(registry), cache=str(tmp_path / "cache"), out=str(tmp_path / "run"),
                                   json=str(json_path))  # fmt: skip
    return _run([sys.executable, "-c", snippet], size=size)


def test_stale_fix_on_a_full_disk_leaves_the_registry_byte_identical(tmp_path):
    folder = tmp_path / "registry"
    folder.mkdir()
    path = folder / "known_issues.toml"
    path.write_text(PADDING + PADDING + GPT2 + BERT)  # every entry "passes now", so --fix rewrites it
    before = path.read_bytes()
    json_path = tmp_path / "stale.json"
    result = _stale_fix(tmp_path, path, json_path, size=1500)
    stderr = result.stderr.decode()
    assert json.loads(json_path.read_text())["entries"], "the findings fit under the limit and were written"
    assert path.read_bytes() == before, "the rewritten registry is larger than the limit: the old one stays"
    assert result.returncode == 2 and "Traceback" not in stderr, stderr
    assert str(path) in stderr and "File too large" in stderr
    assert _leftovers(folder, path) == []


def test_stale_json_on_a_full_disk_keeps_the_previous_findings(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(GPT2 + BERT)
    json_path = tmp_path / "findings" / "stale.json"
    json_path.parent.mkdir()
    previous = json.dumps({"entries": [], "note": "the previous stale check"})
    json_path.write_text(previous)
    result = _stale_fix(tmp_path, path, json_path, size=600)
    assert result.returncode != 0, "the findings are larger than the limit"
    assert json_path.read_text() == previous, result.stderr.decode()[-2000:]
    assert _leftovers(json_path.parent, json_path) == []
    assert path.read_text() == GPT2 + BERT


# ── entries written in a shape other than [[LIST]] tables are refused, never dropped ──


@pytest.mark.parametrize(
    "text, line",
    [
        (f"EXPORT_SKIPS = [{INLINE}]\n", 2),
        (f"EXPORT_SKIPS = [\n  {INLINE},\n]\n", 2),
        (f'[EXPORT_SKIPS]\nmodel = "BertModel"\nscope = "onnx"\nreason = "r"\nurl = "{URL}"\n', 2),
        (f'[["EXPORT_SKIPS"]]\nmodel = "BertModel"\nscope = "onnx"\nreason = "r"\nurl = "{URL}"\n', 2),
        ('EXPORT_SKIPS.model = "BertModel"\n', 2),
        (f"ONNX_DISABLE_OPTIMIZE = [{INLINE}]\n" + GPT2, 2),
    ],
    ids=["inline-array", "multiline-inline-array", "single-table", "quoted-header", "dotted-key", "one-inline-list"],
)
def test_entries_not_written_as_array_tables_are_refused_with_file_line_and_fix(tmp_path, text, line):
    path = tmp_path / "known_issues.toml"
    path.write_text("# header\n" + text)
    with pytest.raises(RegistryError) as failure:
        Registry.load(path)
    message = str(failure.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert "[[EXPORT_SKIPS]]" in message or "[[ONNX_DISABLE_OPTIMIZE]]" in message, message


def test_inline_array_line_numbers_point_at_the_list(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text("# header\n\n" + f"EXPORT_SKIPS = [{INLINE}]\n")
    with pytest.raises(RegistryError, match=r":3: EXPORT_SKIPS .*write each entry as a \[\[EXPORT_SKIPS\]\] table"):
        Registry.load(path)


def test_registry_check_on_an_inline_array_fails_instead_of_reporting_nothing(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(f"EXPORT_SKIPS = [{INLINE}]\n")
    result = _run([sys.executable, "-m", "commands", "registry", "check", "--registry", str(path)])
    assert result.returncode == 2 and "0 entries" not in result.stdout.decode()
    assert "[[EXPORT_SKIPS]]" in result.stderr.decode()


# ── control characters: refused by field, before anything is written ──


@pytest.mark.parametrize(
    "field, value, code",
    [
        ("reason", "bell \x07", "0007"),
        ("reason", "\x1b[31mred", "001B"),
        ("reason", "two\nlines", "000A"),
        ("reason", "a\ttab", "0009"),
        ("reason", "delete \x7f", "007F"),
        ("reason", "next line \x85", "0085"),
        ("reason", "line separator \u2028", "2028"),
        ("model", "Bert\x00Model", "0000"),
        ("scope", "onnx\r", "000D"),
    ],
)
def test_add_refuses_a_control_character_naming_the_field(tmp_path, field, value, code):
    path = tmp_path / "known_issues.toml"
    path.write_text("# header\n" + GPT2)
    before = path.read_bytes()
    fields = {"model": "BertModel", "scope": "onnx", "reason": "needs a fix", "url": URL, field: value}
    entry = Entry("EXPORT_SKIPS", fields["model"], fields["scope"], fields["reason"], fields["url"])
    message = rf"{field} contains the (control character|line separator) U\+{code}"
    with pytest.raises(RegistryError, match=message) as failure:
        Registry.load(path).add(entry)
    assert "not valid TOML" not in str(failure.value) and str(path) in str(failure.value)
    assert path.read_bytes() == before


def test_a_control_character_escaped_in_the_file_is_refused_at_its_line(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text("# header\n" + GPT2.replace('"keeps"', r'"keeps \u001b[2J"'))
    with pytest.raises(RegistryError, match=r":3: EXPORT_SKIPS GPT2Model \[onnx\]: reason contains the control "
                                            r"character U\+001B"):  # fmt: skip
        Registry.load(path)


def test_line_numbers_count_newlines_only(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text("# a comment with a line separator \u2028 and a next-line \x85 in it\n" + GPT2)
    assert [entry.line for entry in Registry.load(path).entries] == [3]


def test_quotes_backslashes_and_unicode_in_a_reason_round_trip(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text("# header\n")
    reason = 'says "no" to C:\\temp\\x, with ü, 漢字 and emoji 🙂'
    Registry.load(path).add(Entry("EXPORT_SKIPS", "BertModel", "onnx", reason, URL))
    (entry,) = Registry.load(path).entries
    assert entry.reason == reason


@pytest.mark.parametrize("reason", ["bell \x07", "\x1b[31mred", b"caf\xff"], ids=["bell", "escape", "undecodable-byte"])
def test_cli_add_refuses_a_control_character_and_leaves_the_file_alone(tmp_path, reason):
    path = tmp_path / "known_issues.toml"
    path.write_text("# header\n" + GPT2)
    before = path.read_bytes()
    result = _run(_cli_add(path, reason, model="BertModel"))
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2 and "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and "reason contains" in stderr and "not valid TOML" not in stderr
    assert path.read_bytes() == before


def test_a_registry_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_bytes(b"# header\n# caf\xe9 in Latin-1\n" + GPT2.encode())
    with pytest.raises(RegistryError, match=r":2: not UTF-8"):
        Registry.load(path)


# ── a stale check with no worker stops at once instead of spinning ──


def test_rerun_with_no_worker_is_refused(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(BERT)
    with pytest.raises(ValueError, match=r"jobs must be 1 or more, not 0"):
        rerun_governed_cells(Registry.load(path), tmp_path / "run", 0, 60.0)


def test_run_stale_with_jobs_0_stops_at_once_with_a_message(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(BERT)
    snippet = textwrap.dedent(f"""
        from types import SimpleNamespace
        from commands.known_issues import cmd_stale
        cmd_stale(SimpleNamespace(registry={str(path)!r}, models="all", model_types=None, tasks=None, limit=None,
                                  cache_dir={str(tmp_path / 'cache')!r}, offline=True, out={str(tmp_path / 'run')!r},
                                  jobs=0, timeout=60.0, json=None, fix=False, strict=False, run=None,
                                  workarounds=False))
    """)  # fmt: skip
    try:
        result = _run([sys.executable, "-c", snippet], timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("stale with jobs=0 was still running after 90 s")
    assert result.returncode != 0 and "jobs must be 1 or more, not 0" in result.stderr.decode()
    assert not (tmp_path / "run").exists(), "refused before a run folder is made"
