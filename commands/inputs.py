"""What the options name, checked before anything runs, and errors said in one line."""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness.store import require_run


def one_line(error: BaseException) -> str:
    """An error as the one line a user reads: a file error by its file, a lookup by its message."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename is not None else error.strerror
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return text.strip() or type(error).__name__


def writable_folder(path: Path, what: str) -> Path:
    """``path`` as a folder we can write into (created if need be), or an error that names the option."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as error:
        raise OSError(f"{what} {path}: cannot write there ({error.strerror or error})") from None
    return path


def existing_run(path: Path | None, what: str):
    """The store of a run folder given as an option; a path that is not one is named, never ignored."""
    if path is None:
        return None
    return require_run(path, what)
