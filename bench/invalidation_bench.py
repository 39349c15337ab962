"""How many cells an edit re-runs: the cells of a finished sweep whose cache key an edit changes, for three planted
edits made to a copy of the code (one model family's patch, a generic ExecuTorch FX node fix, the README), and the
same count under the old rule (the whole exporters/ folder in every key: every edit re-runs every cell).

Each cell is keyed as the cache keys it: with the workarounds it applied in that sweep and the modules its model is
built from (recorded since cells record them; for an older sweep, the modules its modeling file imports).

    .venv/bin/python bench/invalidation_bench.py RUN_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.cache import ResultCache  # noqa: E402
from harness.cells import Cell  # noqa: E402
from harness.models import all_model_classes  # noqa: E402
from harness.store import RunStore  # noqa: E402

EDITS = {
    "one model family's patch (_patch_longformer_attention_dense)": (
        "exporters/dynamo/patches/text.py", '"""Longformer (and LED\'s encoder) gathers',
        '"""Longformer (and LED\'s encoder, edited) gathers'),
    "an ExecuTorch FX node fix (_fix_max_for_xnnpack)": (
        "exporters/executorch/node_fixes.py", "def _fix_max_for_xnnpack(graph_module, node) -> bool:",
        "def _fix_max_for_xnnpack(graph_module, node) -> bool:  # edited"),
    "the README": ("README.md", "# export-sweep", "# export-sweep (edited)"),
}


def keys(cache: ResultCache, cells) -> dict[str, str]:
    return {cell.id: json.dumps(cache.parts(cell, record.modules, record.applied), sort_keys=True) for cell, record in cells}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    classes = all_model_classes()
    cells = [(Cell(classes[r.model_class], r.backend, r.shape_mode), r) for r in RunStore(args.run).records()
             if r.model_class in classes]  # fmt: skip
    results = {"run": str(args.run), "cells": len(cells), "edits": {}}
    with tempfile.TemporaryDirectory() as workspace:
        for label, (path, old, new) in EDITS.items():
            code = Path(workspace) / "code"
            shutil.rmtree(code, ignore_errors=True)
            for folder in ("exporters", "harness"):
                shutil.copytree(ROOT / folder, code / folder, ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(ROOT / "README.md", code / "README.md")
            start = time.perf_counter()
            before = keys(ResultCache(Path(workspace) / "cache", code_root=code), cells)
            seconds = time.perf_counter() - start
            target = code / path
            text = target.read_text()
            assert old in text, f"{path}: the planted edit's anchor is gone"
            target.write_text(text.replace(old, new, 1))
            after = keys(ResultCache(Path(workspace) / "cache", code_root=code), cells)
            changed = sum(before[cell] != after[cell] for cell in before)
            touches_code = path.startswith(("exporters/", "harness/"))
            results["edits"][label] = {"re-run": changed, "share": round(changed / len(cells), 4),
                                       "re-run before (whole exporters/ hashed)": len(cells) if touches_code else 0}  # fmt: skip
            print(f"{label}: {changed} of {len(cells)} cells re-run ({100 * changed / len(cells):.2f} %); "
                  f"before: {len(cells) if touches_code else 0}; keys of every cell in {seconds:.1f} s")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
