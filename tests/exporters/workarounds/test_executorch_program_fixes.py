"""The ExecuTorch workarounds of `exporters/executorch/program_fixes.py` (stage 4, FX program fixes): each passes with
its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from .modules import (
    EntropyPatchStarts,
    FramedSamples,
    PositionedAttention,
    Projection,
    ScoreAtFirstBest,
    TOKENS,
    assert_runs_like_eager,
    check_class_case,
    check_dynamic_cell_case,
    check_pattern_case,
    executorch_dynamic,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    # BLT's patch starts cut at the largest count of entropy peaks (a number read from data), then viewed
    ("BltForCausalLM", "executorch", "_fix_counts_read_from_data_bounded", "data-dependent expression u"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # cuts its patch starts at a count of entropy peaks, on a dynamic axis
    ("BltForCausalLM", "executorch", {"_fix_slices_to_a_count_as_long_as_it": ("to-edge", "memo disaster")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("executorch", ScoreAtFirstBest, {"scores": torch.randn(2, 7)},
     "_fix_counts_read_from_data_bounded", r"data-dependent expression 2 <= -u\d+ - 1"),
]  # fmt: skip


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    check_pattern_case(backend, module, inputs, workaround, error)


def test_executorch_dynamic_axes_get_an_upper_bound():
    model, longer = Projection().eval(), {"tokens": torch.randn(3, 20, 4)}  # four times the traced elements
    exported = executorch_dynamic(model, TOKENS["A"])
    assert "_fix_dynamic_axes_bounded_for_planning" in exported.applied
    assert_runs_like_eager(exported, model, longer)
    with disabled_workarounds("_fix_dynamic_axes_bounded_for_planning"):
        unbounded = executorch_dynamic(model, TOKENS["A"])
    with pytest.raises(RuntimeError, match="set_inputs"):
        unbounded(**longer)  # memory was planned for the traced size only


def test_executorch_plans_a_bounded_axis_for_its_growth_not_for_the_model_bound():
    from exporters.executorch.runtime import execution_plan

    model, tokens = PositionedAttention().eval(), torch.randn(2, 7, 4)
    exported = executorch_dynamic(model, {"tokens": tokens})
    assert_runs_like_eager(exported, model, {"tokens": torch.randn(3, 28, 4)})  # four times the traced length
    with disabled_workarounds("_fix_dynamic_axes_bounded_for_planning"):
        planned_for_the_table = executorch_dynamic(model, {"tokens": tokens})
    # planned for 2,048 positions, the scores alone are 2 x 2,048 x 2,048 floats (32 MB); for 32, 8 KB
    planned, unbounded = (max(execution_plan(e.program).non_const_buffer_sizes) for e in (exported, planned_for_the_table))
    assert planned < 2**20 < 2**25 < unbounded


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
