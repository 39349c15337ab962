"""The ExecuTorch workarounds of `exporters/executorch/program_fixes.py` (stage 4, FX program fixes): each passes with
its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    EntropyPatchStarts,
    FramedSamples,
    Projection,
    ScoreAtFirstBest,
    TOKENS,
    assert_runs_like_eager,
    built_by_the_sweep,
    executorch_dynamic,
    export_tiny,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    # BLT's patch starts cut at the largest count of entropy peaks (a number read from data), then viewed
    ("BltForCausalLM", "executorch", "_fix_counts_read_from_data_bounded", "data-dependent expression u"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    context = built_by_the_sweep(name)
    assert context.ok, context.stages[-1].message
    exported = export_tiny(context, backend)
    assert workaround in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE[backend])
    with disabled_workarounds(workaround), pytest.raises(exporters.ExportError, match=error):
        export_tiny(context, backend)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # cuts its patch starts at a count of entropy peaks, on a dynamic axis
    ("BltForCausalLM", "executorch", {"_fix_slices_to_a_count_as_long_as_it": ("to-edge", "memo disaster")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    """``name``'s dynamic cell as the sweep runs it, with every workaround and with each one disabled: for models
    whose exported outputs are not eager's one for one (a tensor where eager returns None, cache leaves), the
    sweep's parity compares the outputs eager has."""
    from harness.cells import Cell, ClassContext, run_cell
    from harness.models import select

    model_class = select(name)[0]
    context = ClassContext(model_class)
    with_them = run_cell(Cell(model_class, backend, "dynamic"), context)
    assert (with_them.status, with_them.message) == ("pass", None) and set(failures) <= set(with_them.applied)
    for workaround, (stage, message) in failures.items():
        with disabled_workarounds(workaround):
            without = run_cell(Cell(model_class, backend, "dynamic"), context)
        assert without.stage == stage and message in without.message, workaround


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("executorch", ScoreAtFirstBest, {"scores": torch.randn(2, 7)},
     "_fix_counts_read_from_data_bounded", r"data-dependent expression 2 <= -u\d+ - 1"),
]  # fmt: skip


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    model = module().eval()
    exporter, config = exporters.exporter_for(backend)
    exported = exporter.export(model, inputs, config)
    assert workaround in exported.applied
    expected = model(**inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(exported(**inputs).values(), expected, strict=True):
        assert torch.equal(got, want)
    with disabled_workarounds(workaround), pytest.raises(exporters.ExportError, match=error):
        exporter.export(model, inputs, config)


def test_executorch_dynamic_axes_get_an_upper_bound():
    model, longer = Projection().eval(), {"tokens": torch.randn(3, 20, 4)}  # four times the traced elements
    exported = executorch_dynamic(model, TOKENS["A"])
    assert "_fix_unbounded_dynamic_axes" in exported.applied
    assert_runs_like_eager(exported, model, longer)
    with disabled_workarounds("_fix_unbounded_dynamic_axes"):
        unbounded = executorch_dynamic(model, TOKENS["A"])
    with pytest.raises(RuntimeError, match="set_inputs"):
        unbounded(**longer)  # memory was planned for the traced size only


def test_an_axis_sized_by_an_expression_gets_its_bound_from_its_traced_size():
    model = FramedSamples()
    inputs = {"samples": torch.randn(2, 100), "features": torch.randn(2, 5, 20)}
    exported = executorch_dynamic(model, inputs)
    longer = {"samples": torch.randn(3, 180), "features": torch.randn(3, 9, 20)}
    assert_runs_like_eager(exported, model, longer)


def test_executorch_counts_read_from_data_stay_within_a_dynamic_width():
    model, generator = EntropyPatchStarts().eval(), torch.Generator().manual_seed(0)
    exported = executorch_dynamic(model, {"scores": torch.randn(2, 7, generator=generator)})
    assert "_fix_counts_read_from_data_bounded" in exported.applied
    for shape in ((2, 7), (3, 5), (2, 9)):
        scores = torch.randn(*shape, generator=generator)
        (got,) = exported(scores=scores).values()
        assert torch.equal(got, model(scores)) and got.shape[1] < shape[1]
    with disabled_workarounds("_fix_counts_read_from_data_bounded"):
        with pytest.raises(exporters.ExportError, match=r"data-dependent expression u\d+"):
            executorch_dynamic(model, {"scores": torch.randn(2, 7, generator=generator)})
