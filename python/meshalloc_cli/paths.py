"""Where the project's own build products (libmeshalloc.so, the glibc shim) live."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

# The file that marks the repository root (the CMake presets sit at the top).
ROOT_MARKER = "CMakePresets.json"
# The preset `make release` builds, relative to the root.
DEFAULT_BUILD_SUBDIR = Path("build") / "release"
# Build products, relative to the build directory.
MESHALLOC_LIBRARY = Path("src") / "libmeshalloc.so"
GLIBC_SHIM_LIBRARY = Path("tools") / "glibc-shim" / "libmeshalloc-glibc-shim.so"
TRACE_RECORDER_LIBRARY = Path("tools") / "trace" / "libmeshalloc-trace.so"
TRACE_TOOL = Path("tools") / "trace" / "meshalloc-trace"
TRACE_REPLAY_PREPARE = Path("tools") / "trace" / "meshalloc-replay-prepare"
TRACE_REPLAYER = Path("tools") / "trace" / "meshalloc-replay"


def _walk_up(start: Path) -> Optional[Path]:
    for directory in [start, *start.parents]:
        if (directory / ROOT_MARKER).is_file():
            return directory
    return None


def repository_root() -> Optional[Path]:
    """The meshalloc checkout: $MESHALLOC_ROOT, else the one this package sits in (the
    editable install), else one above the current directory; None when there is none."""
    explicit = os.environ.get("MESHALLOC_ROOT")
    if explicit:
        return Path(explicit).resolve()
    return _walk_up(Path(__file__).resolve().parent) or _walk_up(Path.cwd().resolve())


def build_directory() -> Optional[Path]:
    """$MESHALLOC_BUILD_DIR, else <root>/build/release."""
    explicit = os.environ.get("MESHALLOC_BUILD_DIR")
    if explicit:
        return Path(explicit).resolve()
    root = repository_root()
    return root / DEFAULT_BUILD_SUBDIR if root else None
