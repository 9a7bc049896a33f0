"""`meshalloc trace record | dump | stats` (docs/trace.md).

Recording preloads the recorder library (tools/trace/libmeshalloc-trace.so) in front of the
chosen allocator; dump and stats run the native decoder (tools/trace/meshalloc-trace), which
reads a multi-GB trace far faster than Python could, and pass its output through.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from . import paths
from .allocators import Allocator
from .errors import EXIT_FAILURE, EXIT_SIGNAL_BASE, MeshallocError
from .measure import check_command

# The recorder's environment variables (declared in tools/trace/format.h).
ENV_FILE = "MESHALLOC_TRACE_FILE"
ENV_CALLSITES = "MESHALLOC_TRACE_CALLSITES"
DEFAULT_TRACE = Path("meshalloc.trace")
TOOL_PREFIX = "meshalloc-trace: "


def _build_product(relative: Path) -> Path:
    build = paths.build_directory()
    candidate = build / relative if build else relative
    if not candidate.is_file():
        raise MeshallocError(f"{candidate} is missing; build it with `make release`", EXIT_FAILURE)
    return candidate


def recorder_library() -> Path:
    return _build_product(paths.TRACE_RECORDER_LIBRARY)


def decoder_tool() -> Path:
    return _build_product(paths.TRACE_TOOL)


def child_traces(trace: Path) -> List[Path]:
    """The files of forked children and exec'd programs: TRACE.<pid> and TRACE.<pid>.<n>."""
    pattern = re.compile(re.escape(trace.name) + r"\.\d+(\.\d+)?")
    directory = trace.parent if str(trace.parent) else Path(".")
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if pattern.fullmatch(p.name))


def record_environment(trace: Path, allocator: Optional[Allocator], callsites: int) -> dict:
    """The recorder goes first in LD_PRELOAD, so it sees every call and forwards it to the
    allocator preloaded after it (or to the one the program is linked with)."""
    env = allocator.environment() if allocator else dict(os.environ)
    underneath = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = str(recorder_library().resolve()) + (":" + underneath if underneath else "")
    env[ENV_FILE] = str(trace.resolve())
    if callsites:
        env[ENV_CALLSITES] = str(callsites)
    else:
        env.pop(ENV_CALLSITES, None)
    return env


def record(command: Sequence[str], trace: Path, allocator: Optional[Allocator] = None, callsites: int = 0) -> int:
    """Runs the command with the recorder; returns its exit status (128+N for signal N)."""
    env = record_environment(trace, allocator, callsites)
    check_command(command, env)
    if trace.is_dir():
        raise MeshallocError(f"--out {trace} is a directory")
    if not trace.resolve().parent.is_dir():
        raise MeshallocError(f"--out {trace}: directory {trace.resolve().parent} does not exist")
    # The recorder creates its file exclusively (docs/trace.md): clear an earlier recording.
    for old in [trace, *child_traces(trace)]:
        if old.exists():
            old.unlink()
    try:
        completed = subprocess.run(list(command), env=env)
    except OSError as error:
        raise MeshallocError(f"cannot run {command[0]}: {error.strerror}", EXIT_FAILURE) from None
    if not trace.exists():
        raise MeshallocError(f"the program ran but wrote no trace to {trace} (is it statically linked?)", EXIT_FAILURE)
    code = completed.returncode
    return EXIT_SIGNAL_BASE - code if code < 0 else code


def _run_tool(arguments: Sequence[str]) -> int:
    """Runs meshalloc-trace with stdout passed through (a dump can be huge); its one-line
    error becomes ours."""
    tool = decoder_tool()
    try:
        completed = subprocess.run([str(tool), *arguments], stderr=subprocess.PIPE, text=True)
    except OSError as error:
        raise MeshallocError(f"cannot run {tool}: {error.strerror}", EXIT_FAILURE) from None
    if completed.returncode == -signal.SIGPIPE:  # `meshalloc trace dump F | head`
        return 0
    if completed.returncode != 0:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        message = lines[0] if lines else f"{tool.name} failed with status {completed.returncode}"
        if message.startswith(TOOL_PREFIX):
            message = message[len(TOOL_PREFIX):]
        raise MeshallocError(message, completed.returncode if completed.returncode > 0 else EXIT_FAILURE)
    return 0


def _existing(trace: Path) -> Path:
    if not trace.exists():
        raise MeshallocError(f"no such trace file: {trace}", EXIT_FAILURE)
    return trace


def dump(trace: Path, head: Optional[int] = None, thread: Optional[int] = None) -> int:
    arguments = ["dump"]
    if head is not None:
        arguments += ["--head", str(head)]
    if thread is not None:
        arguments += ["--thread", str(thread)]
    return _run_tool([*arguments, str(_existing(trace))])


def stats(trace: Path, json: bool = False) -> int:
    return _run_tool(["stats", *(["--json"] if json else []), str(_existing(trace))])


def compress(trace: Path, out: Optional[Path] = None) -> Tuple[int, int]:
    """Writes TRACE compressed to OUT (default: replaces TRACE, through a temporary file beside
    it, so an interrupted run leaves the original); (bytes before, bytes after)."""
    target = out if out is not None else trace
    partial = target.with_name(target.name + ".compressing")
    partial.unlink(missing_ok=True)
    before = _existing(trace).stat().st_size
    try:
        _run_tool(["compress", str(trace), str(partial)])
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return before, target.stat().st_size
