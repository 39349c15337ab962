"""An experiment, not a change to the exporters: to-edge without ExecuTorch's functionalizing `run_decompositions({})`, whose work the
next `run_decompositions(table)` does anyway. Same cells, alternately with and without, in one process."""

    .venv/bin/python bench/decompose_once_experiment.py BertModel,GPT2LMHeadModel,LlamaForCausalLM,ViTForImageClassification,Wav2Vec2ForCTC,T5EncoderModel

import sys, time, contextlib, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
import torch
from torch.export import ExportedProgram
from harness.cells import Cell, ClassContext, run_cell
from harness.models import select
from harness.workers import warm_imports

original = ExportedProgram.run_decompositions

@contextlib.contextmanager
def functionalize_in_the_next_pass():
    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        if decomp_table is not None and len(decomp_table) == 0 and not args and not kwargs:
            return self
        return original(self, decomp_table, *args, **kwargs)
    ExportedProgram.run_decompositions = run_decompositions
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = original

warm_imports(["executorch"])
rows = []
for model_class in select(sys.argv[1]):
    context = ClassContext(model_class).prepare()
    for shape in ("static", "dynamic"):
        result = {}
        for variant in ("today", "once", "today2", "once2"):
            with (functionalize_in_the_next_pass() if variant.startswith("once") else contextlib.nullcontext()):
                record = run_cell(Cell(model_class, "executorch", shape), context)
            edge = sum(s.seconds for s in record.stages if s.name == "to-edge")
            result[variant] = (record.status, record.stage, round(edge, 1), record.max_abs_diff)
        print(model_class.name, shape, result, flush=True)
        rows.append(result)
for v in ("today", "once"):
    print(v, "to-edge sum", round(sum(min(r[v][2], r[v + "2"][2]) for r in rows), 1))
