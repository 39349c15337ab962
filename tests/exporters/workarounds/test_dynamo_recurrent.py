"""The Dynamo model patches of `exporters/dynamo/patches/recurrent.py` (recurrences as scan ops and triangular solves):
each passes with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds
from harness.inputs import DECODER_LENGTHS, INPUT_SIZES

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    CHUNK_SIZE,
    ChunkSolve,
    built_by_the_sweep,
    exported_on_the_varying_axes,
    fixed_axes_with_and_without,
    row_updates,
)


@pytest.mark.parametrize("name, workaround, text", [
    ("MambaModel", "_patch_selective_scan_as_scan_op", "input_ids"),
    ("RecurrentGemmaModel", "_patch_rg_lru_scan_as_scan_op", "input_ids"),
    ("RwkvModel", "_patch_rwkv_attention_as_scan_op", "input_ids"),
    ("ParakeetForRNNT", "_patch_lstm_as_scan_op", "decoder_input_ids"),  # its prediction network
    ("xLSTMModel", "_patch_mlstm_inference_as_scan_op", "input_ids"),
])  # fmt: skip
def test_recurrences_over_time_keep_a_symbolic_length_as_scan_ops(name, workaround, text):
    fixed = fixed_axes_with_and_without(name, [workaround])
    texts = {label: size[1] for label, size in INPUT_SIZES.items()}
    lengths = DECODER_LENGTHS if text == "decoder_input_ids" else texts
    assert f"{text} axis 1 = {lengths['A']} (second set: {lengths['B']})" in fixed[workaround]


def test_mlstm_as_a_scan_is_the_chunkwise_form_past_a_whole_chunk():
    """Exported on 7 tokens, where eager loops step by step too; run on 70, where eager runs a chunk of 64 in its
    chunkwise form and 6 steps."""
    context = built_by_the_sweep("xLSTMModel")
    assert context.model.config.chunk_size == 64
    exporter, config = exporters.exporter_for("dynamo", dynamic=True,
                                              dynamic_shapes={"input_ids": {1: torch.export.Dim.AUTO}})
    exported = exporter.export(context.model, {"input_ids": context.inputs["A"]["input_ids"]}, config)
    longer = torch.randint(0, context.model.config.vocab_size, (2, 70))
    with torch.no_grad():
        expected = context.model(input_ids=longer).last_hidden_state
    torch.testing.assert_close(exported(input_ids=longer)["last_hidden_state"], expected, atol=1e-4, rtol=1e-4)


# ONNX: a scan whose initial states alias is refused; ExecuTorch: a scan whose carries have a dynamic batch
@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_lstm_as_scan_ops_is_the_lstm_in_both_directions_of_every_layer(backend):
    lstm = torch.nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True).eval()
    batch, length = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("length", min=2, max=64)
    exporter, config = exporters.exporter_for(backend, dynamic=True, dynamic_shapes={"input": {0: batch, 1: length}})

    def export():
        return exporter.export(lstm, {"input": torch.randn(2, 7, 6)}, config)

    exported = export()
    assert "_patch_lstm_as_scan_op" in exported.applied
    other = torch.randn(3, 11, 6)
    with torch.no_grad():
        output, (hidden, cell) = lstm(other)
    got = list(exported(input=other).values())
    for value, expected in zip(got, (output, hidden, cell)):
        torch.testing.assert_close(value, expected, atol=1e-5, rtol=1e-5)
    if backend == "executorch":
        assert "_patch_scan_carries_resized" in exported.applied
        with disabled_workarounds("_patch_scan_carries_resized"):
            copied = export()
        with pytest.raises(RuntimeError, match="0x12"):
            copied(input=other)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_a_scan_lowers_in_its_inference_form(backend):
    """Mamba's selective scan as `scan` (`_patch_selective_scan_as_scan_op`): lowered with autograd on, the scan
    took its training form, whose saved sizes among its outputs failed the lowering."""
    from harness.cells import Cell, ClassContext, run_cell
    from harness.models import select

    model_class = select("MambaModel")[0]
    record = run_cell(Cell(model_class, backend, "dynamic"), ClassContext(model_class))
    assert (record.status, record.message) == ("pass", None)
    assert "_patch_selective_scan_as_scan_op" in record.applied


def test_funnel_relative_shift_as_a_gather_serves_every_length():
    from transformers.models.funnel.modeling_funnel import _relative_shift_gather

    from exporters.dynamo.patches.recurrent import _patch_funnel_relative_shift_indexed

    gathered = _patch_funnel_relative_shift_indexed(_relative_shift_gather)
    for seq_len, context_len, shift in ((7, 7, 1), (4, 7, 2), (3, 5, 2)):  # full length, and after pooling
        scores = torch.randn(2, 3, seq_len, 2 * context_len + shift - 1)
        expected = _relative_shift_gather(scores, context_len, shift)
        torch.testing.assert_close(gathered(scores, context_len, shift), expected)

    context, _, export = exported_on_the_varying_axes("FunnelModel", ["_patch_funnel_relative_shift_indexed"])
    with disabled_workarounds("_patch_funnel_relative_shift_indexed"):
        reshaped = export()
    with pytest.raises(Exception, match="Guard failed"):
        reshaped(**context.inputs["B"])


def test_max_pooling_windows_that_tile_the_sequence_keep_its_length_symbolic():
    pool = torch.nn.MaxPool1d(3)
    length = torch.export.Dim("length", min=6, max=64)
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes={"input": {2: length}})
    exported = exporter.export(pool, {"input": torch.randn(2, 4, 10)}, config)
    assert "_patch_max_pool1d_by_windows" in exported.applied
    longer = torch.randn(2, 4, 13)  # four windows, the last step left out as the pool leaves it
    torch.testing.assert_close(exported(input=longer)["output"], pool(longer))
    with disabled_workarounds("_patch_max_pool1d_by_windows"), pytest.raises(exporters.ExportError):
        exporter.export(pool, {"input": torch.randn(2, 4, 10)}, config)


@pytest.mark.parametrize("backend, error", [("onnx", "linalg_solve_triangular"), ("executorch", "SpecViolationError")])
def test_a_unit_triangular_solve_is_exported_as_products(backend, error):
    model, inputs = ChunkSolve(), {"system": torch.randn(2, 64, 64) * 0.2, "values": torch.randn(2, 64, 3)}
    exporter, config = exporters.exporter_for(backend)
    exported = exporter.export(model, inputs, config)
    assert "_patch_unit_triangular_solve_as_products" in exported.applied
    other = {"system": torch.randn(2, 64, 64) * 0.2, "values": torch.randn(2, 64, 3)}
    (got,) = exported(**other).values()
    torch.testing.assert_close(torch.as_tensor(got), model(**other), atol=1e-4, rtol=1e-4)
    with disabled_workarounds("_patch_unit_triangular_solve_as_products"), pytest.raises(Exception, match=error):
        exporter.export(model, inputs, config)


def test_the_delta_rule_is_traced_as_eagers_solve_not_row_by_row():
    _, as_eager, export = exported_on_the_varying_axes("Qwen3NextModel", ["_patch_delta_rule_solves_as_eager",
                                                                           "_patch_unit_triangular_solve_as_products"])
    with disabled_workarounds("_patch_delta_rule_solves_as_eager"):
        row_by_row = export()
    assert row_updates(row_by_row) - row_updates(as_eager) == CHUNK_SIZE - 1


def test_kimi_delta_attention_takes_one_chunk_as_long_as_a_static_text():
    context = built_by_the_sweep("BailingHybridModel")
    exporter, config = exporters.exporter_for("dynamo")
    exported = exporter.export(context.model, context.inputs["A"], config)
    assert "_patch_kimi_delta_chunks_fit_a_static_text" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_kimi_delta_chunks_fit_a_static_text"):
        in_model_chunks = exporter.export(context.model, context.inputs["A"], config)
    length = context.inputs["A"]["input_ids"].shape[1]
    assert row_updates(in_model_chunks) - row_updates(exported) == (CHUNK_SIZE - 1) - (length - 1)
