"""An experiment, not a change to the exporters: to-edge without ExecuTorch's functionalizing
`run_decompositions({})`, whose work its next `run_decompositions(table)` does anyway. The same cells, twice with
and twice without, alternated, in one process; each cell's status, stage, max difference and to-edge seconds.

    .venv/bin/python bench/decompose_once_experiment.py BertModel,GPT2LMHeadModel,LlamaForCausalLM
"""

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch.export import ExportedProgram  # noqa: E402

from harness.cells import Cell, ClassContext, run_cell  # noqa: E402
from harness.models import select  # noqa: E402
from harness.workers import warm_imports  # noqa: E402

ORIGINAL = ExportedProgram.run_decompositions


@contextlib.contextmanager
def functionalizing_pass_skipped():
    """While active, `run_decompositions({})` returns the program as it is (the next, non-empty table functionalizes)."""

    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        if decomp_table is not None and len(decomp_table) == 0 and not args and not kwargs:
            return self
        return ORIGINAL(self, decomp_table, *args, **kwargs)

    ExportedProgram.run_decompositions = run_decompositions
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = ORIGINAL


def main():
    warm_imports(["executorch"])
    seconds = {"today": 0.0, "once": 0.0}
    for model_class in select(sys.argv[1]):
        context = ClassContext(model_class).prepare()
        for shape in ("static", "dynamic"):
            results = {}
            for variant in ("today", "once", "today", "once"):
                skipped = functionalizing_pass_skipped() if variant == "once" else contextlib.nullcontext()
                with skipped:
                    record = run_cell(Cell(model_class, "executorch", shape), context)
                edge = sum(stage.seconds for stage in record.stages if stage.name == "to-edge")
                seconds[variant] += edge / 2  # the mean of the two runs
                results.setdefault(variant, []).append((record.status, record.stage, record.max_abs_diff, round(edge, 1)))
            same = len({result[:3] for runs in results.values() for result in runs}) == 1
            print(f"{model_class.name} {shape}: {results} {'same' if same else 'DIFFERENT'}", flush=True)
    print(f"to-edge, mean of two runs: today {seconds['today']:.1f} s, once {seconds['once']:.1f} s "
          f"({seconds['once'] / seconds['today']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
