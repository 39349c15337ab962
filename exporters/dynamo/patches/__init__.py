"""Stage 2 of the Dynamo exporter: model patches, ``@register_patch("dynamo", path)`` factories installed for the
trace by ``apply_patches("dynamo")``. The ONNX and ExecuTorch exporters trace through this stage too, so a fix here
serves all three backends.

One file per family of models or of PyTorch pattern. Patches install in registration order, and a family is a run
of that order: its files are imported here, in it. A new patch goes into the file of its family (or a new file,
imported below); ``grids.py`` holds index arithmetic several families share, and no patch.
"""

from . import (  # noqa: F401  (registration order)
    generic,
    lengths,
    attention,
    experts,
    rotary,
    images,
    keypoints,
    vision_patches,
    vision_grids,
    text,
    placeholders,
    audio,
    vision_tokens,
    audio_windows,
    recurrent,
)
