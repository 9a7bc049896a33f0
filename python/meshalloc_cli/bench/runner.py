"""Run experiments and keep results/SUMMARY.md in step with what is on disk.

Each experiment runs into `<out_root>/<name>/` (emptied first) and leaves an `outcome.json`
there, whatever happened to it: ran, skipped (a prerequisite is missing), not available (its
module is not there) or failed (the traceback goes to `error.txt`). SUMMARY.md is then rebuilt
from every `*/outcome.json` under the root, not only from this invocation's, so running one
experiment again keeps the others' results in the summary.

One experiment's crash never stops the others: a benchmark suite that dies at the third of
five experiments after an hour leaves nothing to read.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import paths
from ..allocators import resolve
from ..errors import EXIT_FAILURE, EXIT_OK, EXIT_SIGNAL_BASE, EXIT_USAGE, MeshallocError
from .claims import Tally, summary_claims_table, verdict
from .framework import MODES, Context, ExperimentUnavailable, Outcome

OUTCOME_FILE = "outcome.json"
ERROR_FILE = "error.txt"
LOG_FILE = "log.txt"
SUMMARY_FILE = "SUMMARY.md"
OUTCOME_FORMAT = 1  # bumped when outcome.json changes incompatibly

# What happened to an experiment.
RAN, SKIPPED, NOT_AVAILABLE, FAILED, INTERRUPTED = "ran", "skipped", "not available", "failed", "interrupted"
# Statuses that do not fail the run unless the user asked for that experiment by name.
BENIGN_STATUSES = (SKIPPED, NOT_AVAILABLE)

MIB = 1 << 20
GIB = 1 << 30
SECONDS_PER_MINUTE = 60
# A PNG the experiment lists is shown inline in SUMMARY.md; other files are linked.
INLINE_FIGURE_SUFFIX = ".png"
GIT_TIMEOUT_S = 10


@dataclass
class ExperimentRecord:
    """One experiment as this invocation left it (and as outcome.json stores it)."""

    name: str
    status: str
    title: str = ""
    paper: str = ""
    reason: str = ""  # why it was skipped / failed, one line
    duration_s: float = 0.0
    outcome: Optional[Outcome] = None


@dataclass
class BenchReport:
    """What `meshalloc bench` prints at the end and its exit status."""

    records: List[ExperimentRecord]
    summary: Path
    tally: Tally
    exit_code: int
    counts: Dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Which experiments exist.


def experiment_modules() -> Dict[str, str]:
    # Read at call time, not import time: tests replace the mapping with fakes.
    from . import EXPERIMENT_MODULES

    return dict(EXPERIMENT_MODULES)


def check_names(names: Sequence[str]) -> None:
    known = experiment_modules()
    for name in names:
        if name not in known:
            raise MeshallocError(f"unknown experiment '{name}' (known: {', '.join(known)})", EXIT_USAGE)


def check_allocators(names: Sequence[str], specs: Sequence[str]) -> None:
    """Every --allocators spec must be one allocators.resolve() accepts, or a name one of the
    experiments to run builds itself (its own_allocators); MeshallocError otherwise, before
    anything runs. An experiment that cannot use a name another one built in is skipped."""
    own = set()
    for name in names or experiment_modules():
        try:
            own.update(getattr(load_experiment(name), "own_allocators", ()))
        except Exception:  # a module that cannot load is reported when it runs
            continue
    for spec in specs:
        if spec not in own:
            resolve(spec)


class _NotAvailable(Exception):
    """The experiment's module does not exist (yet)."""


def load_experiment(name: str):
    """The module's EXPERIMENT object; _NotAvailable when the module itself is missing. Any
    other import error (a bug inside the module) propagates and counts as a failure."""
    module_name = f"{__package__}.{experiment_modules()[name]}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            raise _NotAvailable(f"no module {module_name}") from None
        raise
    experiment = getattr(module, "EXPERIMENT", None)
    if experiment is None:
        raise _NotAvailable(f"{module_name} defines no EXPERIMENT")
    return experiment


@dataclass
class Listing:
    name: str
    title: str
    paper: str
    available: bool
    note: str = ""


def list_experiments() -> List[Listing]:
    rows = []
    for name in experiment_modules():
        try:
            experiment = load_experiment(name)
        except _NotAvailable as why:
            rows.append(Listing(name, "", "", False, str(why)))
            continue
        except Exception as error:  # a broken module still gets its line in the list
            rows.append(Listing(name, "", "", False, f"cannot be imported: {_one_line(error)}"))
            continue
        rows.append(Listing(name, experiment.title, experiment.paper, True))
    return rows


# ---------------------------------------------------------------------------------------------
# Running.


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _empty_directory(directory: Path) -> None:
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)


def _relative(path: Path, directory: Path) -> str:
    """A listed file as a path inside the experiment's directory. Experiments build paths
    from context.out, which may itself be relative to the working directory; a bare name is
    taken as already inside the directory."""
    path = Path(path)
    if not path.is_absolute() and (directory / path).exists():
        return str(path)
    try:
        return str(path.resolve().relative_to(directory.resolve()))
    except ValueError:
        return str(path)


def outcome_to_json(record: ExperimentRecord, mode: str, directory: Path, started: datetime,
                    machine: Dict[str, str]) -> Dict[str, Any]:
    outcome = record.outcome
    return {
        "format": OUTCOME_FORMAT,
        "name": record.name,
        "title": record.title,
        "paper": record.paper,
        "status": record.status,
        "reason": record.reason,
        "mode": mode,
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round(record.duration_s, 3),
        "commit": machine.get("commit", ""),
        "repetitions": outcome.repetitions if outcome else 0,
        "claims": [asdict(claim) for claim in outcome.claims] if outcome else [],
        "notes": list(outcome.notes) if outcome else [],
        "failures": list(outcome.failures) if outcome else [],
        "files": [_relative(path, directory) for path in outcome.files] if outcome else [],
        "table_md": outcome.table_md if outcome else "",
    }


def _write_json(path: Path, data: Dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def run_one(name: str, mode: str, out_root: Path, repeat: Optional[int], root: Path, build_dir: Path,
            log: Callable[[str], None], machine: Dict[str, str], allocators: Sequence[str] = (),
            baseline: Optional[str] = None) -> ExperimentRecord:
    directory = out_root / name
    _empty_directory(directory)
    log_file = open(directory / LOG_FILE, "w")

    def experiment_log(line: str) -> None:
        log(f"  {name}: {line}")
        log_file.write(line + "\n")
        log_file.flush()

    record = ExperimentRecord(name=name, status=RAN)
    started = datetime.now().astimezone()
    clock = time.monotonic()
    try:
        experiment = load_experiment(name)
        record.title, record.paper = experiment.title, experiment.paper
        context = Context(mode=mode, out=directory, root=root, build_dir=build_dir, repeat=repeat,
                          log=experiment_log, allocators=tuple(allocators), baseline=baseline)
        outcome = experiment.run(context)
        if not isinstance(outcome, Outcome):
            raise TypeError(f"run() returned {type(outcome).__name__}, not an Outcome")
        record.outcome = outcome
    except _NotAvailable as why:
        record.status, record.reason = NOT_AVAILABLE, str(why)
    except ExperimentUnavailable as why:
        record.status, record.reason = SKIPPED, " ".join(str(why).split()) or "a prerequisite is missing"
    except KeyboardInterrupt:
        record.status, record.reason = INTERRUPTED, "interrupted (Ctrl-C)"
    except Exception as error:  # any bug in one experiment must not stop the others
        record.status, record.reason = FAILED, _one_line(error)
        (directory / ERROR_FILE).write_text(traceback.format_exc())
    finally:
        record.duration_s = time.monotonic() - clock
        log_file.close()
    _write_json(directory / OUTCOME_FILE, outcome_to_json(record, mode, directory, started, machine))
    return record


def run_bench(names: Optional[Sequence[str]], mode: str, out_root: Path, repeat: Optional[int] = None,
              log: Callable[[str], None] = lambda line: None, root: Optional[Path] = None,
              build_dir: Optional[Path] = None, allocators: Sequence[str] = (),
              baseline: Optional[str] = None) -> BenchReport:
    """Run the named experiments (all when `names` is empty or None) in `mode`, then rebuild
    SUMMARY.md. `allocators` and `baseline` are --allocators' specs and --baseline's, handed to
    every experiment (framework.Context). Raises MeshallocError for an unknown name or an
    unusable output root."""
    if mode not in MODES:
        raise MeshallocError(f"unknown mode '{mode}' (one of {', '.join(MODES)})", EXIT_USAGE)
    explicit = list(dict.fromkeys(names or []))  # named twice runs once
    check_names(explicit)
    chosen = explicit or list(experiment_modules())
    root = root or paths.repository_root()
    if root is None:
        raise MeshallocError("not inside a meshalloc checkout (set MESHALLOC_ROOT)", EXIT_USAGE)
    build_dir = build_dir or paths.build_directory() or root / paths.DEFAULT_BUILD_SUBDIR
    try:
        out_root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MeshallocError(f"cannot create {out_root}: {os.strerror(error.errno or 0)}", EXIT_USAGE) from None
    machine = describe_machine(root)

    records: List[ExperimentRecord] = []
    for index, name in enumerate(chosen, 1):
        log(f"[{index}/{len(chosen)}] {name} ({mode})")
        record = run_one(name, mode, out_root, repeat, root, build_dir, log, machine, allocators, baseline)
        records.append(record)
        log(f"[{index}/{len(chosen)}] {name}: {_status_line(record, out_root)}")
        if record.status == INTERRUPTED:
            break

    summary, tally = write_summary(out_root, machine)
    exit_code = EXIT_OK
    for record in records:
        if record.status == FAILED or (record.status in BENIGN_STATUSES and record.name in explicit):
            exit_code = EXIT_FAILURE
        elif record.status == INTERRUPTED:
            exit_code = EXIT_SIGNAL_BASE + int(signal.SIGINT)  # what a shell reports for Ctrl-C
            break
    counts: Dict[str, int] = {}
    for record in records:
        counts[record.status] = counts.get(record.status, 0) + 1
    return BenchReport(records, summary, tally, exit_code, counts)


def _status_line(record: ExperimentRecord, out_root: Path) -> str:
    duration = _duration(record.duration_s)
    if record.status == RAN:
        tally = Tally()
        tally.add([claim.holds for claim in record.outcome.claims])
        failures = f", {len(record.outcome.failures)} failed run(s)" if record.outcome.failures else ""
        return f"done in {duration}: {tally.text()}{failures}"
    if record.status == FAILED:
        return f"FAILED after {duration}: {record.reason} (traceback: {out_root / record.name / ERROR_FILE})"
    return f"{record.status}: {record.reason}"


def _duration(seconds: float) -> str:
    if seconds < SECONDS_PER_MINUTE:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), SECONDS_PER_MINUTE)
    return f"{minutes} min {rest:02d} s"


# ---------------------------------------------------------------------------------------------
# The machine, for the summary's header.


def _git(root: Path, *arguments: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) * 1024 / GIB:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def _debian() -> str:
    try:
        return "Debian " + Path("/etc/debian_version").read_text().strip()
    except OSError:
        return platform.platform()


def describe_machine(root: Path) -> Dict[str, str]:
    commit = _git(root, "rev-parse", "--short", "HEAD") or "unknown"
    # Tracked files only: results/ and build trees are untracked and would always say "dirty".
    changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    dirty = "unknown" if changes is None else ("yes" if changes else "no")
    return {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or "?"),
        "memory": _memory(),
        "kernel": f"Linux {platform.release()}",
        "os": _debian(),
        "commit": commit + ("+dirty" if dirty == "yes" else ""),
        "dirty": dirty,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------------------------------------
# SUMMARY.md


def load_outcomes(out_root: Path) -> List[Dict[str, Any]]:
    """Every */outcome.json under the root: the known experiments in their run order, then
    any others by name. An unreadable file becomes a stub that says so."""
    order = {name: index for index, name in enumerate(experiment_modules())}
    found = []
    for path in out_root.glob(f"*/{OUTCOME_FILE}"):
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            data = {"name": path.parent.name, "status": FAILED, "reason": f"unreadable {path.name}: {error}"}
        data.setdefault("name", path.parent.name)
        found.append(data)
    return sorted(found, key=lambda data: (order.get(data["name"], len(order)), data["name"]))


def _experiment_section(data: Dict[str, Any], tally: Tally) -> List[str]:
    name = data["name"]
    title = data.get("title") or name
    lines = [f"## {title} (`{name}`)", ""]
    facts = []
    if data.get("paper"):
        facts.append(f"reproduces: {data['paper']}")
    status = data.get("status", FAILED)
    facts.append(f"mode: {data.get('mode', '?')}")
    if status == RAN:
        facts.append(f"repetitions: {data.get('repetitions', '?')}")
    if "duration_s" in data:
        facts.append(f"duration: {_duration(float(data['duration_s']))}")
    if data.get("date"):
        facts.append(f"run: {data['date']}" + (f" at {data['commit']}" if data.get("commit") else ""))
    lines.append(" · ".join(facts))
    lines.append("")
    if status != RAN:
        reason = data.get("reason") or ""
        extra = f" (traceback in `{name}/{ERROR_FILE}`)" if status == FAILED else ""
        lines += [f"**{status}**: {reason}{extra}", ""]
        return lines
    for note in data.get("notes") or []:
        lines.append(f"- {note}")
    for failure in data.get("failures") or []:
        lines.append(f"- failed run: {failure}")
    if data.get("notes") or data.get("failures"):
        lines.append("")
    table = (data.get("table_md") or "").strip()
    if table:
        lines += [table, ""]
    claims = data.get("claims") or []
    if claims:
        lines += summary_claims_table(claims) + [""]
        tally.add([verdict(claim) for claim in claims])
    else:
        lines += ["No claims checked.", ""]
    files = data.get("files") or []
    figures = [path for path in files if path.endswith(INLINE_FIGURE_SUFFIX)]
    for figure in figures:
        lines += [f"![{title}]({name}/{figure})", ""]
    if files:
        lines += ["files: " + ", ".join(f"[{path}]({name}/{path})" for path in files), ""]
    return lines


def render_summary(outcomes: Sequence[Dict[str, Any]], machine: Dict[str, str]) -> Tuple[str, Tally]:
    tally = Tally()
    body: List[str] = []
    for data in outcomes:
        body += _experiment_section(data, tally)
    header = [
        "# meshalloc bench: the paper's claims on this machine",
        "",
        "Generated by `meshalloc bench` from every `*/outcome.json` in this directory (see docs/bench.md). "
        "Each claim is the paper's (or an issue's) statement, the paper's number, what this machine "
        "measured, and whether the statement holds here: ✓ holds, ✗ does not hold, — not checked "
        "(the note says why).",
        "",
        f"- machine: {machine['cpu']}, {machine['cores']} CPUs, {machine['memory']} memory, "
        f"{machine['kernel']}, {machine['os']}",
        f"- commit: {machine['commit']} (uncommitted changes to tracked files: {machine['dirty']})",
        f"- summary written: {machine['date']}",
        "",
    ]
    ran = sum(1 for data in outcomes if data.get("status") == RAN)
    footer = [
        "## Tally",
        "",
        f"{ran} of {len(outcomes)} experiments ran; {tally.text()}.",
        "",
    ]
    return "\n".join(header + body + footer), tally


def write_summary(out_root: Path, machine: Optional[Dict[str, str]] = None) -> Tuple[Path, Tally]:
    root = paths.repository_root() or Path.cwd()
    machine = machine or describe_machine(root)
    text, tally = render_summary(load_outcomes(out_root), machine)
    summary = out_root / SUMMARY_FILE
    summary.write_text(text)
    return summary, tally
