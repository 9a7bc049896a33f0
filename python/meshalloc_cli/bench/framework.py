"""The contract between `meshalloc bench` and its experiments.

An experiment is a module in this package with a module-level `EXPERIMENT` object that has
`name`, `title`, `paper` (the section or figure it reproduces) and `run(context) -> Outcome`.
The runner (runner.py) gives every experiment its own output directory, runs it, and sets the
claims each one returns beside the paper's numbers in results/SUMMARY.md. An experiment never
writes outside `context.out` and never decides on its own how long to run: `context.mode`
does (smoke: seconds, for `make test`; quick: the whole `--quick` run stays under ten minutes;
full: the paper's parameters).

The experiments do not write run(): they subclass `Declared` and declare their parameters
per mode, their workloads (and what to prepare once for each), the commands of one run (a
program alone, or a server beside the client that drives it), how to parse it, their columns
and their claims; driver.py runs every declared experiment the same way (schedule,
measurement, failures, TSV, tables, figures, the SUMMARY rows), and `meshalloc compare` on
the same loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from .schedule import INTERLEAVED

if TYPE_CHECKING:  # only for annotations: these modules import this one
    from ..allocators import Allocator
    from ..measure import RunResult
    from .common import Selection
    from .stats import Geomean, Stat

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


# ---------------------------------------------------------------------------------------------
# Declared experiments: what each one states, and nothing else (driver.py does the rest)

# How one run is measured: PSS of the process tree sampled every `interval_s` (measure(), in a
# memory cgroup, with a watchdog at `timeout_s`), or only timed from fork to exit (no sampler
# beside a timed run).
SAMPLED, TIMED = "sampled", "timed"
MEASUREMENTS = (SAMPLED, TIMED)
OK = "ok"  # a Run's status when nothing went wrong
# What each run's directory holds besides a sampled run's samples (output.RUN_FILES).
STDOUT, STDERR = "stdout.txt", "stderr.txt"


@dataclass(frozen=True)
class Parameters:
    """A mode's parameters. An experiment's own record subclasses this (adding its sizes and
    counts); the driver reads `repetitions` (which --repeat replaces) and `order`."""

    repetitions: int
    order: str = INTERLEAVED  # or schedule.ROTATED


@dataclass(frozen=True)
class Pass:
    """One pass of the schedule over every workload × allocator × repetition. Most experiments
    make one (the default, unnamed); speed makes two, a timed pass then a sampled one, since a
    sampler beside a timed run would slow some allocators more than others."""

    name: str  # "" for an experiment's only pass; else it prefixes progress and failure lines
    repetitions: int
    order: str = INTERLEAVED
    directory: str = ""  # where its runs' directories go; "": the experiment's run_directory
    kinds: Optional[Tuple[str, ...]] = None  # the run kinds each slot makes; None: the experiment's `kinds`
    # The pass's own allocator axis (anything with a name), from the session, instead of the
    # experiment's selection: handles times its operations under glibc, jemalloc and meshalloc,
    # not under its cache rows.
    allocators: Optional[Callable[["Session"], Sequence[Any]]] = None


@dataclass
class Served:
    """What a Command's client gets while its program (a server) runs: the run's directory, the
    time the program was started (time.monotonic()) and an event set once it has exited. The
    client drives the server and stops it; what it returns is the Run's `client`."""

    directory: Path
    started: float
    gone: threading.Event = field(default_factory=threading.Event)

    def since_start(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class Command:
    """What one run executes: the same argv, directory and added variables for every allocator
    (the driver adds the allocator's own preload and settings)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Optional[Path] = None
    measure: str = SAMPLED  # one of MEASUREMENTS
    interval_s: float = 0.010
    timeout_s: Optional[float] = 300.0  # None: no limit (`meshalloc compare`)
    use_cgroup: bool = True  # a sampled run in a memory cgroup of its own, where one can be made
    # A client run in a thread beside the program (a server), sampled or timed alike; it gets a
    # Served and must make the server exit. None: the program runs alone.
    client: Optional[Callable[[Served], Any]] = None
    # The allocator preloaded when the schedule's row is not an Allocator itself (redis-lru's
    # Redis configurations); None: the row's.
    allocator: Optional["Allocator"] = None
    inherit_env: bool = True  # False: `env` is the whole environment, not added to this process's


class RunFailed(Exception):
    """Raised by parse() when a run that exited 0 did not do what it must (a wrong checksum, a
    missing result line); the message becomes its status and its failure line, and `figures`
    (what could still be read) stay in runs.tsv."""

    def __init__(self, reason: str, figures: Optional[Mapping[str, Any]] = None):
        super().__init__(reason)
        self.figures: Mapping[str, Any] = figures or {}


@dataclass
class Run:
    """One run of the schedule, as parse() sees it and as Results hold it."""

    workload: Any  # the experiment's workload object
    workload_name: str
    allocator: "Allocator"
    repetition: int  # 1-based
    order: int  # 1-based position in its pass's schedule
    directory: Path  # stdout.txt, stderr.txt (and samples.tsv, summary.json when sampled)
    pass_name: str = ""  # the Pass it belongs to
    status: str = OK  # "ok", or why the run failed: "exit 1", "killed by SIGSEGV", parse()'s reason
    load: Optional[float] = None  # 1-minute load average as the run started
    seconds: Optional[float] = None  # wall time (timed and sampled alike)
    result: Optional["RunResult"] = None  # the samples of a sampled run
    figures: Dict[str, Any] = field(default_factory=dict)  # what parse() returned
    client: Any = None  # what the Command's client returned
    client_error: str = ""  # the client's own exception, when it raised one
    kind: str = ""  # the run kind (Declared.kinds) of this part
    # Every kind's part of this slot, by kind (the first is the Run itself); the Run's status is
    # the first failed part's.
    parts: Dict[str, "Run"] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def stdout(self) -> str:
        return self.output(STDOUT)

    def output(self, name: str) -> str:
        """The text of one of the run's files (STDOUT, STDERR); "" when there is none."""
        path = self.directory / name
        return path.read_text(errors="replace") if path.is_file() else ""

    def sampled_figures(self) -> Dict[str, Any]:
        """A sampled run's memory figures, as the memory tables take them: mean and peak PSS,
        the cgroup's kernel peak, wall time, number of samples and the rate achieved."""
        result = self.result
        if result is None:
            return {}
        summary = result.summary("pss")
        return {
            "mean_pss": summary.mean if summary else None,
            "peak_pss": float(summary.peak) if summary else None,
            "cgroup_peak": float(result.cgroup_kernel_peak) if result.cgroup_kernel_peak is not None else None,
            "wall_s": result.wall_time,
            "samples": len(result.samples),
            "hz": result.achieved_rate,
        }

    def metric(self, key: str) -> Optional[float]:
        """A numeric figure of this run; None when absent or not a number."""
        value = self.figures.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Column:
    """One figure of the summary table: table.tsv gets `tsv` (default: key), key_min, key_max
    and, with `ratio`, key_ratio_to_<baseline>; the default Markdown table shows
    `heading` as median (min–max) after dividing by `scale`."""

    key: str
    heading: str
    decimals: int = 2
    scale: float = 1.0
    ratio: bool = False
    tsv: str = ""


@dataclass
class Session:
    """What the declared parts of one experiment run share: the context, the mode's
    parameters, the allocators chosen, a scratch directory for inputs, and the notes and
    failure lines gathered so far (a hook may add to both)."""

    context: Context
    params: Any  # the experiment's Parameters
    selection: Optional["Selection"]  # set by the experiment's select() before anything else
    scratch: Path
    notes: List[str] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)
    load_start: str = "?"  # the load averages as the experiment started (schedule.load_average)
    # What one hook finds out for the later ones (large-heap: the heaps left out, the first
    # run's checksum that every later run must match).
    state: Dict[str, Any] = field(default_factory=dict)
    current_pass: Pass = Pass("", 1)  # the pass being run: what command() and parse() are called for
    current_kind: str = ""  # the run kind command() is asked for
    # The run being made when command() is called: its workload, allocator, repetition, order and
    # directory (created), nothing measured yet.
    current_run: Optional["Run"] = None
    prepared: Dict[str, Any] = field(default_factory=dict)  # prepare()'s result per workload name

    @property
    def out(self) -> Path:
        return self.context.out

    @property
    def checked(self) -> bool:
        """Whether claims are judged: never on a smoke run's tiny parameters."""
        return self.context.mode != SMOKE

    @property
    def baseline(self) -> Optional[str]:
        return self.selection.baseline if self.selection else None


@dataclass
class Report:
    """What an experiment's report() returns: the table SUMMARY.md shows, the whole of its
    table.md (None: no table.md), and any other files it wrote."""

    table_md: str
    markdown: Optional[str] = None
    files: List[Path] = field(default_factory=list)


class Declared:
    """A declared experiment. Subclasses set the class attributes and override the hooks; the
    instance is made with name, title and paper (common.ExperimentBase supplies them)."""

    # The allocators: its own list, the smoke list (None: the same), the alias variable of
    # --allocators, and the references its ratios may be against, first that runs (none: no
    # ratios, and --baseline only noted). `reference` names it in the "did not run" note.
    allocators: ClassVar[Tuple[str, ...]] = ()
    smoke_allocators: ClassVar[Optional[Tuple[str, ...]]] = None
    alias: ClassVar[Optional[str]] = None
    baselines: ClassVar[Tuple[str, ...]] = ()
    reference: ClassVar[Optional[str]] = None
    workload_heading: ClassVar[str] = "workload"  # the first column of runs.tsv and table.tsv
    run_directory: ClassVar[str] = "runs"  # <out>/<run_directory>/<workload>/<allocator>-r<N>/
    workload_directories: ClassVar[bool] = True  # False: <out>/<run_directory>/<allocator>-r<N>/
    # The runs each slot makes, one after the other (a sampled run, then a timed one of the same
    # server); command() is asked for each (session.current_kind). The first kind's files are
    # stdout.txt and stderr.txt, a later kind's are prefixed with it ("timed-stdout.txt").
    kinds: ClassVar[Tuple[str, ...]] = ("",)
    machine_note: ClassVar[bool] = True  # whether the notes end with the machine's
    # parse()'s figures written to runs.tsv, in order: a key, or (header, key) when they differ.
    run_columns: ClassVar[Tuple[Any, ...]] = ()
    columns: ClassVar[Tuple[Column, ...]] = ()  # the summary table (table.tsv; default table.md)
    progress_separator: ClassVar[str] = " "  # between the runs' words (progress()) in a progress line
    progress_each_run: ClassVar[bool] = False  # a progress line per run (runs of many seconds), not per repetition

    # The parameters of each mode (smoke, quick, full); override parameters() to compute them.
    modes: ClassVar[Mapping[str, Parameters]] = {}

    def parameters(self, mode: str) -> Parameters:
        return self.modes[mode]

    def passes(self, params: Parameters) -> Sequence[Pass]:
        """The passes, in order: by default one, of the parameters' repetitions and order."""
        return [Pass("", params.repetitions, params.order)]

    def select(self, session: Session) -> "Selection":
        """The allocator axis: by default --allocators, --baseline, the alias variable and the
        experiment's own lists (common.choose_allocators). An experiment whose rows are its own
        configurations (redis-lru) returns them here, each with a `name`; it may add notes."""
        from .common import choose_allocators

        return choose_allocators(session.context, self.allocators, self.smoke_allocators, self.alias, self.baselines)

    def workloads(self, session: Session) -> Sequence[Any]:
        """The rows of the schedule (raise ExperimentUnavailable when none can run here)."""
        raise NotImplementedError

    def prepare(self, session: Session, workload: Any) -> Any:
        """Run once per workload before the schedule (traces: record the program); the result
        is session.prepared[workload name], for command() and parse(). RunFailed leaves the
        workload out with a failure line."""
        return None

    def workload_name(self, workload: Any) -> str:
        return str(getattr(workload, "name", workload))

    def command(self, session: Session, workload: Any, allocator: "Allocator") -> Command:
        raise NotImplementedError

    def parse(self, session: Session, run: Run) -> Dict[str, Any]:
        """The figures of one run, in schedule order (raise RunFailed when its output is wrong).
        A run that already failed is parsed too, for what it printed; its status stays."""
        return {}

    def progress(self, run: Run) -> str:
        """A run's word in the progress line."""
        return run.allocator.name if run.ok else f"{run.allocator.name}={run.status}"

    def claims(self, session: Session, results: "Results") -> List[Claim]:
        return []

    def report(self, session: Session, results: "Results", claims: Sequence[Claim]) -> Optional[Report]:
        """The experiment's own tables; None: the driver's default table of `columns`."""
        return None

    def figures(self, session: Session, results: "Results") -> List[Path]:
        return []

    def notes(self, session: Session, results: "Results") -> List[str]:
        """Notes that need the results (appended after the session's, before the machine's)."""
        return []

    def machine_threads(self, session: Session) -> Optional[int]:
        """The thread count the machine note states, when the experiment sets one."""
        return None

    def summary_details(self, session: Session, results: "Results") -> Optional[Dict[str, Any]]:
        """Extra entries of summary.json; None: no summary.json."""
        return None

    def run(self, context: Context) -> Outcome:
        from .driver import drive

        return drive(self, context)


@dataclass
class Results:
    """Every run of a declared experiment, and the numbers its tables and claims are made of."""

    workloads: List[Any]
    rows: List[str]  # the workloads' names, in schedule order
    allocators: List["Allocator"]
    baseline: Optional[str]
    repetitions: int
    runs: List[Run] = field(default_factory=list)

    @property
    def names(self) -> List[str]:
        return [allocator.name for allocator in self.allocators]

    def cell(self, row: str, allocator: str, pass_name: Optional[str] = None) -> List[Run]:
        """The runs of one workload under one allocator (of one pass, when named)."""
        return [run for run in self.runs if run.workload_name == row and run.allocator.name == allocator
                and (pass_name is None or run.pass_name == pass_name)]

    def stat(self, row: str, allocator: str, key: str) -> Optional["Stat"]:
        from .stats import Stat

        return Stat.of([run.metric(key) for run in self.cell(row, allocator) if run.ok])

    def by_repetition(self, row: str, allocator: str, key: str) -> Dict[int, float]:
        """repetition -> the figure of that repetition's successful run (non-zero values only)."""
        return {run.repetition: value for run in self.cell(row, allocator)
                if run.ok and (value := run.metric(key))}

    def ratio(self, row: str, allocator: str, key: str) -> Optional[float]:
        """The cell's median over the baseline's in the same row."""
        from .stats import ratio

        if self.baseline is None:
            return None
        return ratio(self.stat(row, allocator, key), self.stat(row, self.baseline, key))

    def geomean(self, rows: Sequence[str], mine: str, theirs: str, key: str) -> "Geomean":
        """Geometric mean over `rows` of mine's median over theirs; low/high are the extremes
        of the per-repetition geomeans (repetition r against repetition r, every row)."""
        from .stats import geomean_of, paired_ratios, ratio

        pairs = []
        for row in rows:
            value = ratio(self.stat(row, mine, key), self.stat(row, theirs, key))
            pairs.append((value, paired_ratios(self.by_repetition(row, mine, key),
                                               self.by_repetition(row, theirs, key)) if value else {}))
        return geomean_of(pairs)
