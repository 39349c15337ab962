"""What a cell's result depends on in our code, read from the source (no import, no torch): which exporter code every
cell of a backend runs, and each workaround on its own, with the model families it can touch.

Every module of ``exporters/`` is parsed once. A workaround is a function under a ``register_*`` decorator; its
digest covers the decorator, the function, and the module-level helpers only workarounds use (so editing a helper of
one model's patch touches that patch alone). Everything else in the file (imports, pipeline functions, helpers that
pipeline code uses) is the backend's pipeline code, which every cell of the backend runs. Comments outside any
statement change nothing. A patch whose targets all live in ``transformers.models.<family>`` can only touch models
built from that family's modules; any other workaround (torch patches, FX and IR fixes, translations) can touch every
cell of its backend.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

DECORATORS = {"register_patch", "register_fx_node_fix", "register_fx_program_fix", "register_onnx_translation",
              "register_onnx_ir_fix", "register_executorch_backend"}  # fmt: skip
BACKEND_OF_DECORATOR = {"register_onnx_translation": "onnx", "register_onnx_ir_fix": "onnx",
                        "register_executorch_backend": "executorch"}  # fmt: skip
SHARED = "shared"
# ONNX and ExecuTorch trace with the Dynamo exporter first: its pipeline and its patches are theirs too
TRACED_THROUGH = {"dynamo": ("dynamo",), "onnx": ("dynamo", "onnx"), "executorch": ("dynamo", "executorch")}
_MODELS = "transformers.models."


def digest(*parts: bytes | str) -> str:
    """sha256 of the parts, each ended by a NUL (so ("ab", "c") and ("a", "bc") differ)."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode() if isinstance(part, str) else part)
        hasher.update(b"\0")
    return hasher.hexdigest()


@dataclass(frozen=True)
class WorkaroundSource:
    backend: str
    name: str
    targets: tuple[str, ...]
    digest: str
    families: tuple[str, ...] = ()  # "transformers.models.bert": only models built from these can run it

    @property
    def key(self) -> str:
        return f"{self.backend}:{self.name}"


@dataclass
class CodeIndex:
    root: Path
    workarounds: list[WorkaroundSource] = field(default_factory=list)
    pipeline_parts: dict[str, list[str]] = field(default_factory=dict)  # shared / backend -> file digests

    @classmethod
    def read(cls, root: Path) -> CodeIndex:
        index = cls(Path(root))
        for path in sorted((index.root / "exporters").rglob("*.py")):
            relative = path.relative_to(index.root / "exporters").parts
            owner = relative[0] if len(relative) > 1 else SHARED
            workarounds, remainder = _split(path.read_text(), owner)
            index.workarounds.extend(workarounds)
            index.pipeline_parts.setdefault(owner, []).append(f"{'/'.join(relative)}:{digest(remainder)}")
        return index

    def fingerprint(self) -> list[str]:
        """Every part of the code, in order: what a listing of the workarounds was made from."""
        return [*(w.key + ":" + w.digest for w in self.workarounds),
                *(part for parts in self.pipeline_parts.values() for part in parts)]  # fmt: skip

    def pipeline(self, backend: str) -> str:
        """The exporter code every cell of ``backend`` runs, workarounds aside."""
        owners = (SHARED, *TRACED_THROUGH[backend])
        return digest(*(part for owner in owners for part in self.pipeline_parts.get(owner, [])))

    def relevant(self, backend: str, modules, applied=()) -> dict[str, str]:
        """``{backend:name: digest}`` of the workarounds that could touch a cell of ``backend`` whose model is built
        from ``modules``, and of those it applied."""
        chain = TRACED_THROUGH[backend]
        applied = set(applied)
        families = {".".join(module.split(".")[:3]) for module in modules if module.startswith(_MODELS)}
        return {w.key: w.digest for w in self.workarounds if w.backend in chain
                and (not w.families or families.intersection(w.families) or w.name in applied)}  # fmt: skip


def _decorator_name(node: ast.expr) -> str | None:
    function = node.func if isinstance(node, ast.Call) else node
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def _registration(node: ast.AST, owner: str) -> tuple[str, tuple[str, ...]] | None:
    """``(backend, targets)`` of a workaround function, or None for any other statement."""
    if not isinstance(node, ast.FunctionDef):
        return None
    for decorator in node.decorator_list:
        name = _decorator_name(decorator)
        if name not in DECORATORS:
            continue
        arguments = [a.value for a in getattr(decorator, "args", []) if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        backend = BACKEND_OF_DECORATOR.get(name) or (arguments[0] if arguments else owner)
        targets = tuple(arguments[1:]) if name == "register_patch" else ()
        return backend, targets
    return None


def _names_defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _names_used(node: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _split(source: str, owner: str) -> tuple[list[WorkaroundSource], str]:
    """A file's workarounds, each with its own digest, and the rest of the file (its pipeline part)."""
    tree = ast.parse(source)
    statements = tree.body
    lines = source.splitlines()

    def lines_of(node) -> str:  # whole lines, decorators with their function
        decorators = getattr(node, "decorator_list", None) or [node]
        return "\n".join(lines[min(d.lineno for d in decorators) - 1 : node.end_lineno])

    text = {id(node): lines_of(node) for node in statements}
    registered = {id(node): _registration(node, owner) for node in statements}
    defines = {id(node): _names_defined(node) for node in statements}
    uses = {id(node): _names_used(node) for node in statements}
    # helpers only workarounds (or other such helpers) use belong to those workarounds
    users_of: dict[str, list] = {}
    for node in statements:
        for name in uses[id(node)]:
            users_of.setdefault(name, []).append(node)
    owned: set[int] = set()
    changed = True
    while changed:
        changed = False
        for node in statements:
            if registered[id(node)] or id(node) in owned or not defines[id(node)]:
                continue
            users = [user for name in defines[id(node)] for user in users_of.get(name, []) if user is not node]
            if users and all(registered[id(user)] or id(user) in owned for user in users):
                owned.add(id(node))
                changed = True
    by_name = {name: node for node in statements if id(node) in owned for name in defines[id(node)]}

    def helpers_of(node, seen: set[int]) -> list[str]:
        found = []
        for name in sorted(uses[id(node)]):
            helper = by_name.get(name)
            if helper is not None and id(helper) not in seen:
                seen.add(id(helper))
                found += [text[id(helper)], *helpers_of(helper, seen)]
        return found

    workarounds = []
    for node in statements:
        registration = registered[id(node)]
        if registration is None:
            continue
        backend, targets = registration
        families = ()
        if targets and all(target.startswith(_MODELS) for target in targets):
            families = tuple(sorted({_MODELS + target[len(_MODELS):].split(".")[0] for target in targets}))
        own = digest(text[id(node)], *helpers_of(node, {id(node)}))
        workarounds.append(WorkaroundSource(backend, node.name, targets, own, families))
    remainder = "\n".join(text[id(node)] for node in statements if not registered[id(node)] and id(node) not in owned)
    return workarounds, remainder
