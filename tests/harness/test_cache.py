"""Incremental sweeps: a record is reused until something it depends on changes, and only the cells that depend
on the change are invalidated: a model's patch its family's cells, a generic fix its backend's, a comment or a file
no cell runs nothing. The files hashed are real copies, edited for real."""

import shutil
import subprocess
import sys
from pathlib import Path

from harness.cache import ResultCache, transformers_root
from harness.cells import Cell
from harness.models import select
from registry import Registry

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ["BertModel", "BertForMaskedLM", "GPT2Model", "LongformerForMaskedLM"]
BACKENDS = ("dynamo", "onnx", "executorch")


def _cells():
    return [Cell(model, backend, shape) for model in select(",".join(CLASSES))
            for backend in BACKENDS for shape in ("static", "dynamic")]  # fmt: skip


def _keys(cache):
    return {cell.id: cache.key(cell) for cell in _cells()}


def _copies(tmp_path):
    """Our code and the two model folders, copied: edits below touch only the copies."""
    code = tmp_path / "code"
    shutil.copytree(ROOT / "exporters", code / "exporters", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "harness", code / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    models = tmp_path / "transformers"
    for folder in ("bert", "gpt2", "longformer"):
        shutil.copytree(transformers_root() / "models" / folder, models / "models" / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return code, models


def _append(path: Path, text: str):
    path.write_text(path.read_text() + text)


def _edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def _changed(before, after) -> set[str]:
    return {cell for cell in before if before[cell] != after[cell]}


def _changed_by(tmp_path, edit) -> tuple[dict, set[str]]:
    """Every cell's key, then the cells whose key ``edit(code, models)`` on the copies changed."""
    code, models = _copies(tmp_path)
    before = _keys(ResultCache(tmp_path, code_root=code, source_root=models))
    edit(code, models)
    return before, _changed(before, _keys(ResultCache(tmp_path, code_root=code, source_root=models)))


def test_keys_are_stable_and_distinct(tmp_path):
    code, models = _copies(tmp_path)
    first = _keys(ResultCache(tmp_path, code_root=code, source_root=models))
    second = _keys(ResultCache(tmp_path, code_root=code, source_root=models))
    assert first == second
    assert len(set(first.values())) == len(first), "every cell has its own key"


def test_a_changed_modeling_file_invalidates_exactly_that_class(tmp_path):
    def edit(code, models):
        _append(models / "models" / "gpt2" / "modeling_gpt2.py", "\n# a change\n")

    before, changed = _changed_by(tmp_path, edit)
    assert changed == {cell for cell in before if cell.startswith("GPT2Model-")}


def test_a_changed_configuration_file_invalidates_every_class_of_that_model(tmp_path):
    def edit(code, models):
        _append(models / "models" / "bert" / "configuration_bert.py", "\n# a change\n")

    before, changed = _changed_by(tmp_path, edit)
    assert {cell.split("-")[0] for cell in changed} == {"BertModel", "BertForMaskedLM"}


def test_a_changed_onnx_pipeline_file_invalidates_the_onnx_cells_only(tmp_path):
    def edit(code, models):
        _append(code / "exporters" / "onnx" / "exporter.py", "\nEDITED = True\n")

    before, changed = _changed_by(tmp_path, edit)
    assert changed == {cell for cell in before if "-onnx-" in cell}


def test_a_changed_dynamo_pipeline_file_invalidates_every_cell_that_traces_through_it(tmp_path):
    def edit(code, models):
        _append(code / "exporters" / "dynamo" / "exporter.py", "\nEDITED = True\n")

    before, changed = _changed_by(tmp_path, edit)
    assert changed == set(before), "ONNX and ExecuTorch export through the Dynamo trace"


def test_a_changed_model_patch_invalidates_its_family_only(tmp_path):
    def edit(code, models):
        _edit(code / "exporters" / "dynamo" / "patches" / "text.py", '"""Longformer (and LED\'s encoder) gathers',
              '"""Longformer (and LED\'s encoder, edited) gathers')

    before, changed = _changed_by(tmp_path, edit)
    assert changed == {cell for cell in before if cell.startswith("LongformerForMaskedLM-")}


def test_a_changed_executorch_node_fix_invalidates_the_executorch_cells_only(tmp_path):
    def edit(code, models):
        _edit(code / "exporters" / "executorch" / "node_fixes.py", "def _fix_max_for_xnnpack(graph_module, node) -> bool:",
              "def _fix_max_for_xnnpack(graph_module, node) -> bool:  # edited")

    before, changed = _changed_by(tmp_path, edit)
    assert changed == {cell for cell in before if "-executorch-" in cell}


def test_a_comment_or_a_file_no_cell_runs_changes_nothing(tmp_path):
    def edit(code, models):
        _append(code / "exporters" / "onnx" / "workarounds.py", "\n# a note for readers\n")
        _append(code / "harness" / "compare.py", "\nEDITED = True\n")  # reporting: no cell's result depends on it
        (code / "README.md").write_text("edited\n")

    before, changed = _changed_by(tmp_path, edit)
    assert changed == set()


def test_a_registry_entry_invalidates_its_class_only(tmp_path):
    code, models = _copies(tmp_path)
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing\n")
    with_entry = tmp_path / "entry.toml"
    with_entry.write_text('[[EXPORT_SKIPS]]\nmodel = "GPT2Model"\nscope = "onnx"\nreason = "r"\n'
                          'url = "https://github.com/pytorch/pytorch/issues/1"\n')  # fmt: skip
    before = _keys(ResultCache(tmp_path, Registry.load(empty), code_root=code, source_root=models))
    after = _keys(ResultCache(tmp_path, Registry.load(with_entry), code_root=code, source_root=models))
    assert {cell.split("-")[0] for cell in before if before[cell] != after[cell]} == {"GPT2Model"}


def test_a_second_run_reuses_every_cell_and_marks_it(tmp_path):
    command = [sys.executable, "-m", "commands", "run", "--models", "BertModel,GPT2Model", "--backends", "dynamo",
               "--shapes", "static", "--jobs", "1", "--cache-dir", str(tmp_path / "cache"), "--no-report"]  # fmt: skip
    first = subprocess.run([*command, "--out", str(tmp_path / "first")], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([*command, "--out", str(tmp_path / "second")], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert second.returncode == 0, second.stderr[-2000:]
    from harness import RunStore

    records = RunStore(tmp_path / "second").records()
    assert len(records) == 2 and all(record.reused and record.cache_key for record in records)
    assert "0 cells to run (2 already done, 2 of them unchanged" in second.stderr, "no worker started"
    assert records[0].modules and all(module.startswith("transformers.") for module in records[0].modules)
    assert not any(record.reused for record in RunStore(tmp_path / "first").records())
    forced = subprocess.run([*command, "--out", str(tmp_path / "third"), "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert forced.returncode == 0
    assert not any(record.reused for record in RunStore(tmp_path / "third").records())


def test_a_resumed_run_caches_only_the_records_it_made(tmp_path):
    command = [sys.executable, "-m", "commands", "run", "--models", "BertModel", "--backends", "dynamo",
               "--shapes", "static", "--jobs", "1", "--out", str(tmp_path / "run"), "--no-report"]  # fmt: skip
    first = subprocess.run([*command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    from harness import RunStore

    store = RunStore(tmp_path / "run")
    (record,) = store.records()
    cache = ResultCache(tmp_path / "cache")
    assert cache.save_from(store, since="9999") == 0  # made before this run: other code may have made it
    assert cache.save_from(store, since=record.started_at) == 1


def test_a_fully_cached_run_imports_no_torch_and_a_dry_run_says_why(tmp_path):
    command = [sys.executable, "-m", "commands", "run", "--models", "BertModel", "--backends", "dynamo",
               "--shapes", "static", "--jobs", "1", "--cache-dir", str(tmp_path / "cache"), "--no-report"]  # fmt: skip
    first = subprocess.run([*command, "--out", str(tmp_path / "first")], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    probe = ("import runpy, sys\nsys.argv = ['commands', *sys.argv[1:]]\ntry:\n    runpy.run_module('commands', "
             "run_name='__main__')\nexcept SystemExit:\n    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO TORCH')")
    again = subprocess.run([sys.executable, "-c", probe, *command[3:], "--out", str(tmp_path / "again")], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert again.stdout.strip().endswith("NO TORCH"), again.stdout + again.stderr[-2000:]
    dry = subprocess.run([*command, "--models", "BertModel,GPT2Model", "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "1 of 2 cells would run (1 unchanged)" in dry.stdout
    assert "not run before with these versions  (e.g. GPT2Model-dynamo-static)" in dry.stdout
