"""The contract between `meshalloc bench` and its experiments.

An experiment is a module in this package with a module-level `EXPERIMENT` object that has
`name`, `title`, `paper` (the section or figure it reproduces) and `run(context) -> Outcome`.
The runner (runner.py) gives every experiment its own output directory, runs it, and sets the
claims each one returns beside the paper's numbers in results/SUMMARY.md. An experiment never
writes outside `context.out` and never decides on its own how long to run: `context.mode`
does (smoke: seconds, for `make test`; quick: the whole `--quick` run stays under ten minutes;
full: the paper's parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Protocol, Tuple

SMOKE, QUICK, FULL = "smoke", "quick", "full"
MODES = (SMOKE, QUICK, FULL)


@dataclass
class Claim:
    """One statement of the paper (or of an issue's target), checked on this machine."""

    claim: str  # the statement, in words: "meshalloc 2y mean heap vs jemalloc"
    paper: str  # the paper's figure, as text: "0.61x (39 % less)"
    ours: str  # what this machine measured, as text, with its spread: "0.90x (0.87-0.93, 3 runs)"
    holds: Optional[bool]  # None: could not be checked here (and `note` says why)
    note: str = ""


@dataclass
class Outcome:
    """What one experiment produced. Paths are inside the experiment's directory."""

    repetitions: int  # how many times each configuration ran
    claims: List[Claim] = field(default_factory=list)
    table_md: str = ""  # the experiment's main table (Markdown), copied into SUMMARY.md
    files: List[Path] = field(default_factory=list)  # raw samples, TSV, Markdown, PNG, SVG
    failures: List[str] = field(default_factory=list)  # one line per failed run
    notes: List[str] = field(default_factory=list)  # caveats the reader must see (e.g. a substitute)


@dataclass
class Context:
    mode: str  # one of MODES
    out: Path  # results/<experiment>/, created and empty
    root: Path  # the repository checkout
    build_dir: Path  # build/release: bench/, tools/, src/libmeshalloc.so
    repeat: Optional[int]  # --repeat: overrides the mode's default repetition count when set
    log: Callable[[str], None]  # progress lines for the terminal
    # --allocators: the user's specs (allocators.resolve), which replace the experiment's own
    # list; empty: the experiment's (or its alias variable's). --baseline: the allocator its
    # ratios are against, instead of the experiment's.
    allocators: Tuple[str, ...] = ()
    baseline: Optional[str] = None

    @property
    def meshalloc_lib(self) -> Path:
        return self.build_dir / "src" / "libmeshalloc.so"

    def repetitions(self, smoke: int, quick: int, full: int) -> int:
        if self.repeat is not None:
            return self.repeat
        return {SMOKE: smoke, QUICK: quick, FULL: full}[self.mode]

    def pick(self, smoke, quick, full):
        """The mode's value of a parameter: context.pick(1_000, 100_000, 700_000)."""
        return {SMOKE: smoke, QUICK: quick, FULL: full}[self.mode]


class Experiment(Protocol):
    name: str  # the command-line name: "redis-lru"
    title: str  # "Redis LRU cache"
    paper: str  # "Mesh §6.2.2, figure 7"

    def run(self, context: Context) -> Outcome:
        ...


class ExperimentUnavailable(Exception):
    """Raised by run() when a prerequisite is missing (a program, a build); the runner
    reports it as a skipped experiment with this message instead of a crash."""
