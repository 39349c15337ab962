"""The command layer: ``export-sweep`` and its commands, above everything they drive.

It parses options, checks what they name before anything runs, and calls downward into ``harness`` (the sweep),
``registry`` (the known issues) and ``reports`` (the dashboard), none of which imports it.
"""

from .cli import main

__all__ = ["main"]
