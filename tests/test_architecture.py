"""The shape of the code (issue 53): imports run one way, no private name crosses a module, the exporters' files stay
small enough to read, and one grep per backend lists exactly its registered workarounds.

The import graph is read from the source (the AST), every import counted, a function's own imports too: a loop
through a function-local import is still a loop. An edge goes to the module named (``from package import module``
to that module): the parent packages Python runs first are not edges, or every package whose ``__init__`` offers its
modules' names would be a loop.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The layers, lowest first: each imports only those before it (and itself). The command layer sits on top.
LAYERS = ("exporters", "harness", "registry", "reports", "commands")
MAX_EXPORTER_LINES = 1300


def _modules() -> dict[str, Path]:
    """Every module of the layers, by dotted name (a package by its own name)."""
    modules = {}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _modules()


def _package_of(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str):
    """``(line, imported module, imported names)`` for every import in module ``name``, resolved to absolute names."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name)
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".") if base else package
            yield node.lineno, base, [alias.name for alias in node.names]


def _repo_module(dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is a module of the layers."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return None


def _graph() -> dict[str, set[str]]:
    graph = {name: set() for name in MODULES}
    for name in MODULES:
        for _line, module, names in _imports(name):
            # `from package import submodule` imports the submodule; any other name comes from the module itself
            targets = [f"{module}.{item}" if f"{module}.{item}" in MODULES else module for item in names] or [module]
            for target in targets:
                found = _repo_module(target)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def _loops(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _cycle_in(graph, component) -> list[str]:
    """One loop through ``component``, as a path of modules, for the failure message."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        successors = sorted(graph[path[-1]] & component)
        closing = [successor for successor in successors if successor == start]
        if closing and len(path) > 1:
            return [*path, start]
        fresh = [successor for successor in successors if successor not in seen]
        if not fresh:
            return [*path, "..."]
        path.append(fresh[0])
        seen.add(fresh[0])


def test_the_import_graph_has_no_loop():
    graph = _graph()
    loops = _loops(graph)
    assert not loops, "import loops: " + "; ".join(" -> ".join(_cycle_in(graph, loop)) for loop in loops)


def test_each_layer_imports_only_the_layers_below_it():
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    upward = []
    for name in MODULES:
        for line, module, _names in _imports(name):
            target = _repo_module(module)
            if target is not None and rank[target.split(".")[0]] > rank[name.split(".")[0]]:
                upward.append(f"{MODULES[name].relative_to(ROOT)}:{line}: imports {module}")
    assert not upward, "imports against the layers (" + " < ".join(LAYERS) + "):\n" + "\n".join(upward)


def test_no_private_name_is_imported_from_another_module():
    crossings = []
    for name in MODULES:
        for line, module, names in _imports(name):
            if _repo_module(module) is None:
                continue
            for item in names:
                private = item.startswith("_") and not item.startswith("__")
                if private and f"{module}.{item}" not in MODULES:
                    crossings.append(f"{MODULES[name].relative_to(ROOT)}:{line}: from {module} import {item}")
            if any(part.startswith("_") and not part.startswith("__") for part in module.split(".")):
                crossings.append(f"{MODULES[name].relative_to(ROOT)}:{line}: imports private module {module}")
    assert not crossings, "private names imported across modules:\n" + "\n".join(crossings)


def test_only_a_bench_imports_transformers_own_exporters():
    """We write our own exporters: `transformers.exporters` is read to learn facts and timed beside ours in bench/."""
    importers = [f"{MODULES[name].relative_to(ROOT)}:{line}" for name in MODULES for line, module, names in _imports(name)
                 if module.startswith("transformers.exporters") or (module == "transformers" and "exporters" in names)]  # fmt: skip
    scripts = [path for path in (*ROOT.glob("*.py"), *(ROOT / "tests").rglob("*.py")) if path != Path(__file__)]
    importers += [str(path.relative_to(ROOT)) for path in scripts if "transformers.exporters" in path.read_text()]
    assert importers == []
    assert "import transformers.exporters" in (ROOT / "bench" / "peer_bench.py").read_text()


def test_no_file_of_the_exporters_is_longer_than_a_reader_can_hold():
    long = {str(path.relative_to(ROOT)): count for path in sorted((ROOT / "exporters").rglob("*.py"))
            if (count := len(path.read_text().splitlines())) > MAX_EXPORTER_LINES}  # fmt: skip
    assert not long, f"files of exporters/ over {MAX_EXPORTER_LINES} lines: {long}"


WORKAROUND = re.compile(r"^def ((?:_patch_|_fix_|_aten_|prepare_for_)\w+)", re.MULTILINE)


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_one_grep_lists_every_workaround_of_a_backend_and_nothing_else(backend):
    """``grep -rnE "^def (_patch_|_fix_|_aten_|prepare_for_)" exporters/<backend>/`` is the listing's names."""
    from exporters.workarounds import workarounds

    grepped = sorted(name for path in (ROOT / "exporters" / backend).rglob("*.py")
                     for name in WORKAROUND.findall(path.read_text()))  # fmt: skip
    listed = sorted(entry.split(":")[0] for entries in workarounds(backend).values() for entry in entries)
    assert grepped == listed


def _modules_imported_by(probe: str) -> set[str]:
    ran = subprocess.run([sys.executable, "-c", f"import sys\n{probe}\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return set(ran.stdout.split())


def test_reading_the_backends_imports_no_torch_and_a_backend_imports_only_what_it_traces_through():
    assert "torch" not in _modules_imported_by("from exporters.backends import BACKENDS\nimport exporters")
    onnx = _modules_imported_by("import exporters\nexporters.OnnxExporter")
    assert {"exporters.onnx", "exporters.dynamo"} <= onnx and "exporters.executorch" not in onnx
    dynamo = _modules_imported_by("import exporters.dynamo")
    assert not {"exporters.onnx", "exporters.executorch"} & dynamo
