"""The Dynamo model patches of `exporters/dynamo/patches/rotary.py` (complex rotary embeddings): each passes with its
workaround and fails, or differs from eager, without it.
"""

import pytest

import exporters
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE, assert_parity
from .modules import export_tiny


@pytest.mark.parametrize(
    "backend, error, stage",
    [("onnx", "complex-valued input", "onnx-translation"), ("executorch", "view_as_complex", "to-edge")],
)
def test_complex_rotary_is_rotated_in_real_arithmetic(tiny, backend, error, stage):
    model = tiny("DeepseekV2ForCausalLM")  # its rotary table is complex (torch.polar)
    exported = export_tiny(model, backend)
    assert {"_patch_complex_rotary_as_pairs", "_patch_rotate_pairs"} <= set(exported.applied)
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE[backend])
    workarounds = ("_patch_complex_rotary_as_pairs", "_patch_rotate_pairs")
    with disabled_workarounds(*workarounds), pytest.raises(exporters.ExportError, match=error) as failure:
        export_tiny(model, backend)
    assert failure.value.stage == stage
