"""The workaround registry: patches live only while a backend traces, and bad registrations fail loudly."""

import subprocess
import sys

import pytest
import torch

import exporters
from exporters import registration, workarounds
from exporters.errors import PatchPathError
from exporters.registration import apply_patches, register_patch


class Doubler(torch.nn.Module):
    def forward(self, x):
        return torch.where(x > 0, x * 2, x)


@pytest.fixture
def scratch_patches():
    """Registrations made by a test are removed after it. The exporters' own are loaded first: restoring the saved
    lists must not drop those of an exporter the test happened to import."""
    workarounds.load_registrations()
    saved = {backend: list(patches) for backend, patches in registration.PATCHES.items()}
    yield
    for backend, patches in saved.items():
        registration.PATCHES[backend][:] = patches


def test_patch_is_active_during_tracing_only(scratch_patches):
    seen = []

    @register_patch("dynamo", "torch.where", model_side="planted by a test")
    def _patch_where_spy(original):
        def where(*args):
            seen.append(original)
            return original(*args)

        return where

    real_where = torch.where
    exported = exporters.DynamoExporter().export(Doubler(), {"x": torch.tensor([-1.0, 2.0])})
    assert seen == [real_where], "the factory receives the real torch op, and the model called the replacement"
    assert torch.where is real_where, "restored after the export"
    assert "_patch_where_spy" in exported.applied
    torch.where(torch.tensor([True]), 1.0, 2.0)
    assert len(seen) == 1, "not active outside the export"


def test_patch_is_restored_when_the_export_raises(scratch_patches):
    class Broken(torch.nn.Module):
        def forward(self, x):
            torch.where(x > 0, x, x)
            raise ValueError("model bug")

    @register_patch("onnx", "torch.where", "torch.Tensor.softmax", model_side="planted by a test")
    def _patch_two_paths(original):
        return lambda *args, **kwargs: original(*args, **kwargs)

    real_where, real_softmax = torch.where, torch.Tensor.softmax
    with pytest.raises(exporters.OnnxExportError) as failure:
        exporters.OnnxExporter().export(Broken(), {"x": torch.ones(2)})
    assert failure.value.stage == "torch-export"
    assert "model bug" in str(failure.value)
    assert torch.where is real_where
    assert torch.Tensor.softmax is real_softmax
    assert "softmax" not in vars(torch.Tensor), "an inherited attribute is deleted again, not shadowed"


def test_a_builtin_is_shadowed_in_one_module_while_tracing_and_unshadowed_after(scratch_patches):
    import types

    module = types.ModuleType("batch_reader")
    exec("def batch(x):\n    return len(x)", module.__dict__)
    sys.modules["batch_reader"] = module
    try:
        originals = []

        @register_patch("dynamo", "batch_reader.len", model_side="planted by a test")
        def _patch_len_spy(original):
            originals.append(original)
            return lambda value: original(value) + 100

        with apply_patches("dynamo"):
            assert module.batch([1, 2]) == 102, "the module's code reads the shadowing name"
            assert len([1, 2]) == 2, "the builtin itself is untouched"
        assert originals == [len]
        assert "len" not in vars(module) and module.batch([1, 2]) == 2
    finally:
        del sys.modules["batch_reader"]
    with pytest.raises(PatchPathError, match="has no attribute 'no_such_builtin'"):
        registration.resolve_path("torch.nn.functional.no_such_builtin")


def test_several_paths_share_one_factory(scratch_patches):
    originals = []

    @register_patch("dynamo", "torch.sin", "torch.cos", model_side="planted by a test")
    def _patch_trig(original):
        originals.append(original)
        return original

    with apply_patches("dynamo"):
        pass
    assert originals == [torch._C._VariableFunctions.sin, torch._C._VariableFunctions.cos]


def test_nested_exports_leave_no_patch_behind(scratch_patches):
    @register_patch("dynamo", "torch.where", model_side="planted by a test")
    def _patch_where_identity(original):
        return lambda *args: original(*args)

    real_where = torch.where
    with apply_patches("dynamo"):
        patched = torch.where
        assert patched is not real_where
        with apply_patches("dynamo"):
            assert torch.where is patched, "an inner export of the same backend does not wrap the patch again"
        assert torch.where is patched
        with apply_patches("onnx"):
            pass
        assert torch.where is patched
    assert torch.where is real_where


def test_class_method_patch_keeps_descriptor_kind(scratch_patches):
    class Holder:
        @staticmethod
        def scale(x):
            return x * 3

    import sys
    import types

    module = types.ModuleType("scratch_holder")
    module.Holder = Holder
    sys.modules["scratch_holder"] = module
    try:

        @register_patch("dynamo", "scratch_holder.Holder.scale", model_side="planted by a test")
        def _patch_scale(original):
            return lambda x: original(x) + 1

        with apply_patches("dynamo"):
            assert Holder.scale(1) == 4 and Holder().scale(1) == 4
        assert Holder.scale(1) == 3
    finally:
        del sys.modules["scratch_holder"]


def test_unresolvable_path_names_backend_and_path(scratch_patches):
    @register_patch("executorch", "torch.no_such_op", model_side="planted by a test")
    def _patch_missing(original):
        return original

    with pytest.raises(PatchPathError, match=r"executorch patch _patch_missing: 'torch.no_such_op'.*no attribute"):
        with apply_patches("executorch"):
            pass
    assert workarounds.check_patch_paths("executorch") == [
        "executorch patch _patch_missing: 'torch.no_such_op': torch has no attribute 'no_such_op'"
    ]


def test_malformed_path_and_unknown_backend_fail_at_registration():
    with pytest.raises(PatchPathError, match="not a dotted path"):
        register_patch("onnx", "where", model_side="planted by a test")
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'"):
        register_patch("tensorrt", "torch.where", model_side="planted by a test")
    with pytest.raises(ValueError, match="unknown backend"):
        registration.register_fx_node_fix("openvino", model_side="planted by a test")


def test_a_second_workaround_of_one_name_is_refused_naming_both_places(scratch_patches):
    @register_patch("dynamo", "torch.where", model_side="planted by a test")
    def _patch_twice(original):
        return original

    with pytest.raises(ValueError, match=r"dynamo workaround _patch_twice is registered twice: at .*test_registry.py:\d+ "
                                         r"and at .*test_registry.py:\d+; rename one"):

        @register_patch("dynamo", "torch.sin", model_side="planted by a test")
        def _patch_twice(original):  # noqa: F811
            return original

    with pytest.raises(ValueError, match="dynamo workaround _patch_module_cast_to_its_own_dtype is registered twice"):

        @registration.register_fx_node_fix("dynamo", model_side="planted by a test")
        def _patch_module_cast_to_its_own_dtype(graph_module, node):
            return False

    @register_patch("onnx", "torch.where", model_side="planted by a test")
    def _patch_twice(original):  # noqa: F811  (another backend: its own names)
        return original


def test_apply_patches_refuses_a_backend_whose_package_was_never_imported():
    probe = (
        "import pytest\n"
        "from exporters.registration import apply_patches\n"
        "with pytest.raises(RuntimeError, match='no onnx workaround is registered yet: import exporters.onnx first'):\n"
        "    with apply_patches('onnx'):\n"
        "        pass\n"
        "print('refused')\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert ran.stdout.strip() == "refused", ran.stderr


def test_every_registered_path_resolves():
    assert workarounds.check_patch_paths() == []


def test_disabled_workarounds_rejects_unknown_names():
    with pytest.raises(KeyError, match="_patch_nope"):
        with workarounds.disabled_workarounds("_patch_nope"):
            pass


def test_every_workaround_is_documented():
    for backend in exporters.BACKENDS:
        for kind, entries in workarounds.workarounds(backend).items():
            for entry in entries:
                assert ": " in entry, f"{backend} {kind} {entry} has no docstring"
