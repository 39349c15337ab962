"""The registry file: validation names file, line and entry; edits keep everything else as it was."""

import pytest

import registry
from harness.models import all_model_classes
from registry import Entry, Registry, RegistryError

URL = "https://github.com/pytorch/pytorch/issues/12345"
HEADER = "# Known issues for the tests.\n"


def _write(tmp_path, text):
    path = tmp_path / "known_issues.toml"
    path.write_text(text)
    return path


def _entry(list_="EXPORT_SKIPS", model="BertModel", scope="onnx.dynamic", url=URL, reason="needs a fix", extra=""):
    return f'\n[[{list_}]]\nmodel = "{model}"\nscope = "{scope}"\nreason = "{reason}"\nurl = "{url}"\n{extra}'


def test_the_shipped_registry_is_valid_for_the_installed_transformers():
    loaded = Registry.load()
    assert loaded.check(all_model_classes()) == []
    for entry in loaded.entries:
        assert entry.url.startswith("https://github.com/") and entry.reason


def test_entries_are_importable_as_mappings_keyed_by_scope(tmp_path):
    path = _write(tmp_path, HEADER + _entry() + _entry("ONNX_DISABLE_OPTIMIZE", "GPT2Model", "dynamic"))
    lists = Registry.load(path).lists()
    assert lists["EXPORT_SKIPS"]["onnx.dynamic"]["BertModel"].url == URL
    assert lists["ONNX_DISABLE_OPTIMIZE"]["dynamic"]["GPT2Model"].model == "GPT2Model"
    assert isinstance(registry.EXPORT_SKIPS, dict) and isinstance(registry.ONNX_DISABLE_OPTIMIZE, dict)


def test_scopes_govern_the_cells_they_name(tmp_path):
    path = _write(tmp_path, HEADER + _entry(scope="dynamic") + _entry("ONNX_DISABLE_OPTIMIZE", "GPT2Model", "static"))
    loaded = Registry.load(path)
    assert loaded.skip_for("BertModel", "executorch", "dynamic") is not None
    assert loaded.skip_for("BertModel", "executorch", "static") is None
    assert loaded.optimize_disabled_for("GPT2Model", "static") is not None
    assert loaded.cells_of(loaded.entries[1]) == [("onnx", "static")]


@pytest.mark.parametrize(
    "text, message",
    [
        (_entry(url="https://example.com/bug"), r":3: EXPORT_SKIPS BertModel \[onnx.dynamic\]: url .* not a GitHub"),
        (_entry(url=""), r":3: .*url is missing or empty"),
        (_entry(reason=""), r":3: .*reason is missing or empty"),
        (_entry(scope="tpu"), r":3: .*unknown scope 'tpu'"),
        (_entry("ONNX_DISABLE_OPTIMIZE", scope="executorch"), r":3: .*unknown scope 'executorch'"),
        (_entry(extra='colour = "red"\n'), r":3: .*unknown field 'colour'"),
        (_entry(extra='fixed_when = "soon"\n'), r":3: .*fixed_when 'soon' is not a version condition"),
        (_entry() + _entry(), r":9: .*duplicate of the entry at line 3"),
        (_entry(scope="all") + _entry(scope="onnx"), r":9: .*overlaps the entry at line 3 \(all\)"),
        (_entry(scope="onnx") + _entry("ONNX_DISABLE_OPTIMIZE", scope="all"), r":9: .*contradicts EXPORT_SKIPS"),
        ("\n[[SKIPS]]\nmodel = 'x'\n", r":3: unknown list 'SKIPS'"),
        ("[[EXPORT_SKIPS]\n", r"not valid TOML"),
    ],
)
def test_a_malformed_entry_is_refused_with_file_line_and_entry(tmp_path, text, message):
    path = _write(tmp_path, HEADER + text)
    with pytest.raises(RegistryError, match=message) as failure:
        Registry.load(path)
    assert str(path) in str(failure.value)


def test_a_vanished_class_is_reported_with_near_matches(tmp_path):
    path = _write(tmp_path, HEADER + _entry(model="BertModle"))
    problems = Registry.load(path).check(all_model_classes())
    assert [p.kind for p in problems] == ["vanished"]
    assert "BertModle" in str(problems[0]) and "near: BertModel" in str(problems[0]) and ":3:" in str(problems[0])


def test_add_appends_and_leaves_the_file_as_it_was(tmp_path):
    original = HEADER + "# a comment about the first entry\n" + _entry() + "# trailing note\n"
    path = _write(tmp_path, original)
    loaded = Registry.load(path)
    added = loaded.add(Entry("EXPORT_SKIPS", "GPT2Model", "executorch", "reason", URL), all_model_classes())
    text = path.read_text()
    assert text.startswith(original)
    assert added.line == text.splitlines().index("[[EXPORT_SKIPS]]", 5) + 1
    assert Registry.load(path).skip_for("GPT2Model", "executorch", "static") is not None


@pytest.mark.parametrize(
    "entry, message",
    [
        (Entry("EXPORT_SKIPS", "GPT2Model", "onnx", "reason", "https://example.com/x"), "not a GitHub"),
        (Entry("EXPORT_SKIPS", "BertModel", "onnx.dynamic", "reason", URL), "duplicate"),
        (Entry("EXPORT_SKIPS", "NoSuchModelX", "onnx", "reason", URL), "vanished"),
    ],
)
def test_add_refuses_what_validation_rejects(tmp_path, entry, message):
    path = _write(tmp_path, HEADER + _entry())
    before = path.read_text()
    with pytest.raises(RegistryError, match=message):
        Registry.load(path).add(entry, all_model_classes())
    assert path.read_text() == before


def test_without_removes_exactly_one_block_and_its_comment(tmp_path):
    keep_a = "# keeps: the first\n" + _entry(model="GPT2Model").lstrip("\n")
    drop = "# goes with its entry\n" + _entry(model="BertModel").lstrip("\n")
    keep_b = "# keeps: the last\n" + _entry("ONNX_DISABLE_OPTIMIZE", "ViTModel", "dynamic").lstrip("\n")
    path = _write(tmp_path, HEADER + "\n" + keep_a + "\n" + drop + "\n" + keep_b)
    loaded = Registry.load(path)
    bert = next(e for e in loaded.entries if e.model == "BertModel")
    assert loaded.without([bert]) == HEADER + "\n" + keep_a + "\n" + keep_b


def test_cli_check_and_add(tmp_path):
    import subprocess
    import sys

    path = _write(tmp_path, HEADER + _entry())
    command = [sys.executable, "-m", "commands", "registry"]
    checked = subprocess.run([*command, "check", "--registry", str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and "1 entries, 0 problems" in checked.stdout
    refused = subprocess.run(
        [*command, "add", "--registry", str(path), "--list", "EXPORT_SKIPS", "--scope", "onnx", "--model", "GPT2Model",
         "--reason", "x", "--url", "https://github.com/o/r"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "not a GitHub issue" in refused.stderr
    added = subprocess.run(
        [*command, "add", "--registry", str(path), "--list", "EXPORT_SKIPS", "--scope", "onnx", "--model", "GPT2Model",
         "--reason", "x", "--url", URL], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert added.returncode == 0 and "added EXPORT_SKIPS GPT2Model [onnx]" in added.stdout
