"""What the experiments share besides scheduling (schedule.py), numbers (stats.py), files
(report.py) and claims (claims.py): their common shape (ExperimentBase), which allocators they
run (--allocators, --baseline, the alias variables), the private copy of libmeshalloc.so they
preload, and the machine."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from ..allocators import SYSTEM_ALLOCATORS, Allocator, configuration_problem, resolve, split_list
from ..errors import MeshallocError
from .framework import SMOKE, Context, ExperimentUnavailable
from .schedule import load_average

# The `key=value` fields of the one result line each benchmark program prints (bench/*.cc,
# bench/thread_scaling, bench/ruby/strings.rb).
KEY_VALUE = re.compile(r"(\w+)=(\S+)")


# ---------------------------------------------------------------------------------------------
# The experiment

@dataclass(frozen=True)
class ExperimentBase:
    """What every experiment says of itself (framework.Experiment); a subclass adds run()."""

    name: str  # the command-line name: "redis-lru"
    title: str  # "Redis LRU cache"
    paper: str  # "Mesh §6.2.2, figure 7"
    # Names --allocators may give that this experiment builds itself rather than by resolving
    # them as allocator specs (redis-lru's "jemalloc+activedefrag").
    own_allocators: Tuple[str, ...] = ()


def checked_repetitions(context: Context, counts: Mapping[str, int]) -> int:
    """The mode's repetition count (or --repeat's); fewer than one is no run at all."""
    repetitions = context.repetitions(**counts)
    if repetitions < 1:
        raise ExperimentUnavailable("the repetition count must be at least 1")
    return repetitions


def names_from(variable: str) -> Optional[List[str]]:
    """The names an environment variable narrows a run to (comma- or space-separated), or None."""
    return split_list(os.environ.get(variable, "")) or None


@dataclass
class Selection:
    """The allocators an experiment runs, in table order, and its ratios' reference."""

    allocators: List[Allocator]
    skipped: List[str]  # one line for each of the experiment's own choices that cannot run here
    baseline: Optional[str]  # an allocator's name, None when no candidate runs
    unused_baseline: Optional[str] = None  # --baseline, given to an experiment without ratios

    @property
    def names(self) -> List[str]:
        return [allocator.name for allocator in self.allocators]

    def notes(self, reference: Optional[str] = None) -> List[str]:
        """A note per skipped allocator, and one when the experiment's reference for its ratios
        did not run (and no --baseline replaced it)."""
        lines = [f"Skipped allocator {line}" for line in self.skipped]
        if self.unused_baseline:
            lines.append(f"--baseline {self.unused_baseline} does not apply: this experiment has no ratios.")
        if reference is not None and self.baseline is None:
            lines.append(f"{reference} did not run: there are no ratios, and no claim about them can be checked.")
        return lines


def built(context: Context, relative: Path) -> Path:
    """A program `make release` builds (relative to the build directory); the experiment is
    skipped, saying so, when it is not there."""
    path = context.build_dir / relative
    if not path.is_file():
        raise ExperimentUnavailable(f"{path} is missing (run `make release`)")
    return path


def requested_specs(context: Context, defaults: Sequence[str], smoke: Optional[Sequence[str]] = None,
                    alias: Optional[str] = None) -> Tuple[List[str], Optional[str]]:
    """The specs a run asks for: --allocators', else the alias variable's, else the experiment's
    own for the mode (`smoke` in smoke mode); and where the user gave them (None: the
    experiment's own)."""
    if context.allocators:
        return list(context.allocators), "--allocators"
    named = names_from(alias) if alias else None
    if named:
        return named, alias
    return list(smoke if smoke is not None and context.mode == SMOKE else defaults), None


def choose_allocators(context: Context, defaults: Sequence[str], smoke: Optional[Sequence[str]] = None,
                      alias: Optional[str] = None, baselines: Sequence[str] = ()) -> Selection:
    """What every experiment runs: --allocators when given, else the alias variable, else the
    experiment's own list for the mode (`smoke` in smoke mode). A spec of the user's that
    cannot run stops the experiment; one of the experiment's own is skipped with a note.
    Every run of the project's libmeshalloc.so preloads one private copy of it
    (private_meshalloc_copy). The baseline is --baseline (put first when the list lacks it),
    else the first of the experiment's `baselines` that runs; an experiment without
    `baselines` has no ratios, and --baseline is only noted."""
    specs, source = requested_specs(context, defaults, smoke, alias)
    by_user = source is not None
    allocators: List[Allocator] = []
    skipped: List[str] = []
    for spec in specs:
        try:
            allocator = resolve(spec, context.build_dir)
        except MeshallocError as error:
            if by_user:
                raise ExperimentUnavailable(f"{source}: {error}") from None
            skipped.append(f"{spec}: {error}")
            continue
        if allocator.name not in [chosen.name for chosen in allocators]:
            allocators.append(allocator)
    baseline = next((name for name in baselines if name in [allocator.name for allocator in allocators]), None)
    unused = context.baseline if context.baseline and not baselines else None
    if context.baseline and not unused:
        try:
            wanted = resolve(context.baseline, context.build_dir)
        except MeshallocError as error:
            raise ExperimentUnavailable(f"--baseline: {error}") from None
        if wanted.name not in [allocator.name for allocator in allocators]:
            allocators.insert(0, wanted)
        baseline = wanted.name
    if not allocators:
        raise ExperimentUnavailable("no allocator can run here: " + "; ".join(skipped))
    return Selection(with_private_meshalloc(context, allocators), skipped, baseline, unused)


def check_configurations(allocators: Sequence[Allocator]) -> List[str]:
    """A warning for each meshalloc allocator that does not run as its spec says (the library
    lists its options when asked: allocators.configuration_problem)."""
    return [f"warning: {problem}" for problem in map(configuration_problem, allocators) if problem]


def with_private_meshalloc(context: Context, allocators: Sequence[Allocator]) -> List[Allocator]:
    """The allocators, those that preload the project's libmeshalloc.so preloading the
    experiment's private copy of it instead (another build, given by path, stays as it is)."""
    project = context.meshalloc_lib.resolve() if context.meshalloc_lib.is_file() else None
    uses_project = [allocator for allocator in allocators
                    if project is not None and allocator.library is not None
                    and Path(allocator.library).resolve() == project]
    if not uses_project:
        return list(allocators)
    copy = private_meshalloc_copy(context)
    return [replace(allocator, library=copy) if allocator in uses_project else allocator for allocator in allocators]


# ---------------------------------------------------------------------------------------------
# The library and the machine

def quiet(command: Sequence[str], cwd: Optional[Path] = None) -> str:
    """A command's standard output, stripped; "" when it cannot run."""
    try:
        return subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def private_library_copy(library: Path, directory: Path) -> Path:
    """libmeshalloc.so copied aside for the whole experiment, so that a `make release` in
    the middle of it cannot put two versions of the library in one table."""
    copy = directory / library.name
    shutil.copy2(library, copy)
    return copy


def private_meshalloc_copy(context: Context) -> Optional[Path]:
    """A copy of libmeshalloc.so in the output directory, which every meshalloc run preloads:
    a `make release` elsewhere during the experiment must not mix two builds in one table.
    meshalloc-version.txt says which build it was."""
    library = context.meshalloc_lib
    if not library.is_file():
        return None
    copy = private_library_copy(library, context.out)
    commit = quiet(["git", "rev-parse", "HEAD"], context.root)
    changed = len([line for line in quiet(["git", "status", "--porcelain", "--", "src"], context.root).splitlines()
                   if line.strip()])
    built = datetime.fromtimestamp(library.stat().st_mtime).isoformat(sep=" ", timespec="seconds")
    (context.out / "meshalloc-version.txt").write_text(
        f"library: {library} ({built})\ncommit: {commit or 'unknown'}\n"
        f"uncommitted changes under src/: {changed} file(s)\n")
    return copy


def machine_notes(allocators: Sequence[Allocator], threads: Optional[int], load_start: str) -> List[str]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    versions = []
    for allocator in allocators:
        package = SYSTEM_ALLOCATORS.get(allocator.name, (None, None))[1]
        version = quiet(["dpkg-query", "-W", "-f", "${Version}", package]) if package else ""
        if version:
            versions.append(f"{allocator.name} {version}")
    text = f"Machine: {cpu or platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}. "
    if threads is not None:
        text += (f"{threads} threads for the multi-threaded microbenchmarks "
                 f"(prodcons: {max(2, threads // 2 * 2)}). ")
    text += f"Load average at the start {load_start}, at the end {load_average()}."
    return [text + (f" Packages: {', '.join(versions)}." if versions else "")]
