"""Real programs from Debian for `meshalloc bench speed` and `meshalloc bench real-apps`, and how
one command is run for its time or for its memory (both experiments run them the same way).

Each program is a small dataclass: the Debian program it needs, what it models, its size in each
mode, and a `prepare` step that builds its inputs in a scratch directory (a generated git
repository, a SQL file) and returns the command. Inputs are built once, without any allocator
preloaded, and never changed by a run, so every allocator and every repetition does exactly the
same work. The scripts the interpreters run live in bench/programs/. Every program prints one
line that depends only on its input; a run whose line differs from the reference (the same
program without LD_PRELOAD) computed something else and is counted as failed. See
docs/speed.md and docs/real-apps.md.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .. import allocators as allocator_registry
from ..allocators import Allocator
from ..measure import MIB, RunResult, measure
from ..output import RUN_FILES
from .framework import Context, Run, RunFailed

SCRIPTS = Path("bench") / "programs"  # relative to the repository root
# Debian's interpreter, not a pyenv or virtualenv shim (a shim is a shell script that would be
# preloaded and timed too, and the issue asks for Debian's programs).
DEBIAN_PYTHON = Path("/usr/bin/python3")
STDERR_TAIL_CHARACTERS = 300  # of a failed run's stderr, kept for the failure line
# What ld.so prints (and then runs the program on glibc anyway) when LD_PRELOAD names a library
# it cannot load: such a run measured the wrong allocator and must count as failed.
PRELOAD_FAILURE = "from LD_PRELOAD cannot be preloaded"
SEED = 2019
PROGRAM = "program"  # a Workload's kind for these programs (speed adds its microbenchmarks' kinds)
# Microbenchmarks last 0.05-0.5 s: sample fast enough to see their peak. Programs last
# 0.5-2 s: the paper's 100 Hz (mstat) is enough.
MICRO_INTERVAL_S = 0.002
PROGRAM_INTERVAL_S = 0.010


@dataclass(frozen=True)
class Prepared:
    """A program ready to run: the same command, directory and variables for every allocator."""

    command: List[str]
    cwd: Path
    env: Dict[str, str] = field(default_factory=dict)  # added to the inherited environment


@dataclass(frozen=True)
class Program:
    name: str  # the row name: "sqlite3"
    executable: str  # the program that must be installed
    package: str  # the Debian package that installs it
    models: str  # what the run does, in one line (for tables and docs)
    scales: Tuple[int, int, int]  # the size parameter in smoke, quick, full
    prepare: Callable[[Path, Path, int], Prepared]  # (repository root, scratch directory, scale)

    def available(self) -> bool:
        return shutil.which(self.executable) is not None

    def scale(self, context: Context) -> int:
        return context.pick(*self.scales)


def _python_interpreter() -> str:
    if DEBIAN_PYTHON.is_file():
        return str(DEBIAN_PYTHON)
    found = shutil.which("python3") or "python3"
    try:  # see through launcher shims to the interpreter itself
        return subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                              check=True).stdout.strip() or found
    except (OSError, subprocess.CalledProcessError):
        return found


def _prepare_python(root: Path, work: Path, scale: int) -> Prepared:
    # pymalloc stays on (the interpreter as users run it); the script leans on objects above
    # its 512-byte limit, which come from malloc.
    return Prepared([_python_interpreter(), str(root / SCRIPTS / "alloc_heavy.py"), str(scale)], work,
                    {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"})


def _prepare_ruby(root: Path, work: Path, scale: int) -> Prepared:
    return Prepared(["ruby", str(root / SCRIPTS / "alloc_heavy.rb"), str(scale)], work)


def _prepare_perl(root: Path, work: Path, scale: int) -> Prepared:
    return Prepared(["perl", str(root / SCRIPTS / "alloc_heavy.pl"), str(scale)], work)


# -- sqlite3: a bulk load through many INSERT statements, then queries ---------------------

SQL_CUSTOMERS_PER_SCALE = 1500
SQL_ORDERS_PER_SCALE = 15000
SQL_ROWS_PER_INSERT = 200  # rows per INSERT statement, as a dump or a batching client writes them
SQL_CITIES = ("Amherst", "Boston", "Chicago", "Denver", "Eugene", "Fresno", "Gary", "Houston", "Irvine", "Juneau")
SQL_ITEMS = 400


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _insert_statements(table: str, rows: Iterable[Sequence[str]]) -> Iterable[str]:
    batch: List[str] = []
    for row in rows:
        batch.append("(" + ",".join(row) + ")")
        if len(batch) == SQL_ROWS_PER_INSERT:
            yield f"INSERT INTO {table} VALUES {','.join(batch)};\n"
            batch = []
    if batch:
        yield f"INSERT INTO {table} VALUES {','.join(batch)};\n"


def write_sql(path: Path, scale: int) -> None:
    """The whole session: schema, a bulk load of generated rows in one transaction, indexes,
    joins and aggregates (sqlite's sorter and hash tables), deletes and updates, a check."""
    rng = random.Random(SEED)
    customers = SQL_CUSTOMERS_PER_SCALE * scale
    orders = SQL_ORDERS_PER_SCALE * scale
    customer_rows = ((str(i), _sql_text(f"customer-{rng.randrange(10 ** 9):09d}-{i}"),
                      _sql_text(rng.choice(SQL_CITIES)), str(rng.randrange(20000))) for i in range(1, customers + 1))
    order_rows = ((str(i), str(rng.randrange(1, customers + 1)), _sql_text(f"item-{rng.randrange(SQL_ITEMS):04d}"),
                   str(rng.randrange(1, 20)), f"{rng.randrange(100, 100000) / 100:.2f}",
                   _sql_text("note " * rng.randrange(1, 60))) for i in range(1, orders + 1))
    with open(path, "w") as sql:
        sql.write("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, joined INTEGER);\n"
                  "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER, item TEXT, quantity INTEGER,"
                  " price REAL, note TEXT);\nBEGIN;\n")
        sql.writelines(_insert_statements("customers", customer_rows))
        sql.writelines(_insert_statements("orders", order_rows))
        sql.write("""COMMIT;
CREATE INDEX orders_customer ON orders (customer);
CREATE INDEX orders_item ON orders (item, price);
SELECT count(*), sum(quantity), round(sum(price * quantity), 2) FROM orders;
SELECT c.city, count(*), round(sum(o.price * o.quantity), 2) FROM orders o JOIN customers c ON c.id = o.customer
  GROUP BY c.city ORDER BY 3 DESC, 1;
SELECT item, count(DISTINCT customer), max(price) FROM orders GROUP BY item ORDER BY 2 DESC, 1 LIMIT 5;
SELECT c.name, count(*) AS n FROM customers c JOIN orders o ON o.customer = c.id GROUP BY c.id
  ORDER BY n DESC, c.name LIMIT 3;
SELECT length(group_concat(name, ',')) FROM (SELECT name FROM customers ORDER BY name DESC);
DELETE FROM orders WHERE quantity % 3 = 0;
UPDATE orders SET note = note || 'updated ' WHERE id % 5 = 0;
SELECT count(*), sum(length(note)) FROM orders;
PRAGMA integrity_check;
""")


def _prepare_sqlite(root: Path, work: Path, scale: int) -> Prepared:
    script = work / "bulk.sql"
    write_sql(script, scale)
    # An in-memory database: every page lives in sqlite's malloc'ed page cache, and no run
    # waits for the disk (fsync latency would be the file system's time, not the allocator's).
    return Prepared(["sqlite3", "-batch", "-bail", ":memory:", f".read {script}"], work)


# -- git: a generated repository -------------------------------------------------------------

GIT_FILES_PER_SCALE = 12
GIT_COMMITS_PER_SCALE = 40
GIT_LINES_PER_FILE = 300
GIT_EPOCH = 1_700_000_000  # fixed dates: the same commit hashes on every run and machine
GIT_IDENTITY = "Tester <tester@example.invalid>"
# The file every commit touches, so that blame has a long history to walk.
GIT_HOT_FILE = "src/core.c"
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
           "LC_ALL": "C"}


def _source_line(rng: random.Random, number: int) -> str:
    return f"static int f{number}_{rng.randrange(10 ** 6)}(int x) {{ return x * {rng.randrange(97)} + {number}; }}\n"


def fast_import_stream(scale: int) -> bytes:
    """A history for `git fast-import`: files of C-like lines, and commits that each change a
    few of them (lines inserted, deleted and rewritten) plus the hot file."""
    rng = random.Random(SEED)
    paths = [GIT_HOT_FILE] + [f"src/module{index:03d}.c" for index in range(GIT_FILES_PER_SCALE * scale)]
    files = {path: [_source_line(rng, line) for line in range(GIT_LINES_PER_FILE)] for path in paths}
    chunks: List[bytes] = []

    def data(payload: bytes) -> None:
        chunks.append(b"data %d\n" % len(payload) + payload + b"\n")

    for commit in range(1, GIT_COMMITS_PER_SCALE * scale + 1):
        changed = [GIT_HOT_FILE] + rng.sample(paths[1:], min(len(paths) - 1, rng.randrange(1, 6)))
        stamp = GIT_EPOCH + commit * 3600
        chunks.append(b"commit refs/heads/main\nmark :%d\nauthor %s %d +0000\ncommitter %s %d +0000\n"
                      % (commit, GIT_IDENTITY.encode(), stamp, GIT_IDENTITY.encode(), stamp))
        data(f"change {commit}: {len(changed)} files".encode())
        if commit > 1:
            chunks.append(b"from :%d\n" % (commit - 1))
        for path in changed:
            lines = files[path]
            for _ in range(rng.randrange(1, 12)):
                at = rng.randrange(len(lines))
                action = rng.randrange(3)
                if action == 0:
                    lines.insert(at, _source_line(rng, commit))
                elif action == 1 and len(lines) > 10:
                    del lines[at]
                else:
                    lines[at] = _source_line(rng, commit)
            chunks.append(f"M 100644 inline {path}\n".encode())
            data("".join(lines).encode())
    return b"".join(chunks)


def _prepare_git(root: Path, work: Path, scale: int) -> Prepared:
    repository = work / "repository.git"
    env = dict(os.environ, HOME=str(work), **GIT_ENV)
    env.pop("LD_PRELOAD", None)  # the inputs are built by git as it is, never under a test allocator
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(repository)], env=env, check=True)
    subprocess.run(["git", "-C", str(repository), "fast-import", "--quiet"], input=fast_import_stream(scale),
                   env=env, check=True)
    return Prepared(["sh", str(root / SCRIPTS / "git_history.sh"), str(repository), GIT_HOT_FILE], work,
                    {"HOME": str(work), **GIT_ENV})


# The programs, in table order. Scales: smoke about 0.1-0.3 s a run, quick about 0.5 s, full
# 1.5-2 s under glibc on the 2-CPU development machine.
PROGRAMS: Tuple[Program, ...] = (
    Program("python3", "python3", "python3",
            "a service's caches thinned at random, JSON round trips, growing buffers, 2 threads",
            (1, 2, 8), _prepare_python),
    Program("ruby", "ruby", "ruby", "a session store with expiry and GC, templates by concatenation, 2 threads",
            (1, 2, 6), _prepare_ruby),
    Program("perl", "perl", "perl", "mail filtering in the manner of SPEC's 400.perlbench: tokenise, count, sort",
            (1, 2, 6), _prepare_perl),
    Program("sqlite3", "sqlite3", "sqlite3", "bulk INSERT of generated rows into an in-memory database, "
            "indexes, joins, aggregates, deletes", (1, 3, 10), _prepare_sqlite),
    Program("git", "git", "git", "log -p, blame, full repack and fsck of a generated repository",
            (1, 3, 8), _prepare_git),
)


def available_programs() -> Tuple[List[Program], List[str]]:
    """The installed programs, and a note for each missing one."""
    found, missing = [], []
    for program in PROGRAMS:
        if program.available():
            found.append(program)
        else:
            missing.append(f"{program.name}: not installed (apt-get install {program.package})")
    return found, missing


# ---------------------------------------------------------------------------------------------
# Running a command once for its time

@dataclass
class TimedRun:
    seconds: Optional[float]  # wall time from start to exit; None when it did not finish
    status: str  # "ok", or why the run failed: "exit 1", "killed by SIGSEGV", "timeout"
    stdout: str
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def exit_status(returncode: int) -> str:
    if returncode == 0:
        return "ok"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def timed_run(command: Sequence[str], allocator: Allocator, cwd: Optional[Path], env: Mapping[str, str],
              timeout: float, inherit_env: bool = True) -> TimedRun:
    """Run once, without any sampling or cgroup, and time it from fork to exit. The command
    gets its own process group, so a timeout (or a Ctrl-C here) kills all it started. `env` is
    added to this process's environment (with inherit_env False, it is the whole of it)."""
    child_env = allocator.environment(dict(os.environ, **env) if inherit_env else dict(env))
    start = time.monotonic()
    try:
        process = subprocess.Popen(list(command), cwd=cwd, env=child_env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as error:
        return TimedRun(None, f"cannot start: {error.strerror or error}", "", "")
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        elapsed = time.monotonic() - start
        status = exit_status(process.returncode)
    except subprocess.TimeoutExpired:
        kill_group(process)
        stdout, stderr = process.communicate()
        elapsed, status = None, "timeout"
    except BaseException:
        kill_group(process)
        process.wait()
        raise
    text = stderr.decode(errors="replace").strip()
    if status == "ok" and PRELOAD_FAILURE in text:
        status = "the allocator was not preloaded"
    return TimedRun(elapsed if status == "ok" else None, status, stdout.decode(errors="replace"),
                    text[-STDERR_TAIL_CHARACTERS:])


def kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# Running a command once for its memory

def memory_run(command: Sequence[str], allocator: Allocator, cwd: Optional[Path], env: Mapping[str, str],
               interval: float, timeout: Optional[float], stdout, stderr, use_cgroup: bool = True,
               inherit_env: bool = True) -> RunResult:
    """measure() with a time limit: PSS of the process tree every `interval` seconds, in a
    memory cgroup where one can be made (its kernel high-water mark catches a peak between two
    samples). After `timeout` seconds (None: no limit) a watchdog kills the processes this one
    started (only the measured tree runs at that moment), and the run comes back as killed.
    stdout and stderr are what subprocess takes: an open file, DEVNULL, STDOUT."""
    def expire() -> None:
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()

    watchdog = threading.Timer(timeout, expire) if timeout is not None else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    try:
        return measure(list(command), allocator, interval, use_cgroup=use_cgroup,
                       env=dict(os.environ, **env) if inherit_env else dict(env),
                       cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    finally:
        if watchdog is not None:
            watchdog.cancel()


# ---------------------------------------------------------------------------------------------
# Workloads under every allocator: what speed and real-apps run, and their memory pass


@dataclass
class Workload:
    """One row of the table, ready to run under any allocator."""

    name: str
    kind: str  # ST, MT or PROGRAM
    command: List[str]
    cwd: Optional[Path]
    env: Dict[str, str]
    pattern: str
    shown: str  # the command as the docs and tables show it: paths relative to the checkout
    reference: Optional[str] = None  # a program's output without LD_PRELOAD, which every run must match

    @property
    def reports_time(self) -> bool:
        """Microbenchmarks print the wall time of their measured work (start-up excluded)."""
        return self.kind != PROGRAM


def shown_command(command: Sequence[str], root: Path, work: Optional[Path]) -> str:
    """The command with the checkout's path left out and the scratch directory called WORK."""
    text = " ".join(command)
    if work is not None:
        text = text.replace(str(work), "WORK")
    return text.replace(str(root) + os.sep, "")


def program_workloads(context: Context, programs: Sequence[Program], scratch: Path, timeout: float) -> Tuple[
        List[Workload], List[str]]:
    """The programs with their inputs built, each with the output of a run without any
    preload (also a warm-up: binaries and inputs are in the page cache before the first timed
    run). A program that fails even then is left out, with a failure line."""
    system = allocator_registry.resolve("system")
    workloads, failures = [], []
    for program in programs:
        work = scratch / program.name
        work.mkdir()
        context.log(f"preparing {program.name} (scale {program.scale(context)})")
        try:
            prepared = program.prepare(context.root, work, program.scale(context))
        except (OSError, subprocess.CalledProcessError) as error:
            failures.append(f"{program.name}: preparing its inputs failed: {error}")
            continue
        reference = timed_run(prepared.command, system, prepared.cwd, prepared.env, timeout)
        if not reference.ok:
            failures.append(f"{program.name}: fails without any preload ({reference.status}): {reference.stderr_tail}")
            continue
        workloads.append(Workload(program.name, PROGRAM, prepared.command, prepared.cwd, prepared.env, program.models,
                                  shown_command(prepared.command, context.root, work),
                                  reference=reference.stdout.strip()))
    return workloads, failures


def memory_figures(run: Run, out: Path) -> Dict[str, Any]:
    """A declared experiment's sampled run of a Workload (speed's memory pass, real-apps): its
    memory figures and where its samples are; RunFailed when a program's output differs from
    its output without preload (it computed something else)."""
    figures = run.sampled_figures()
    if run.result is not None:
        figures["samples_tsv"] = str((run.directory / RUN_FILES["samples"]).relative_to(out))
    if run.ok and run.workload.reference is not None and run.stdout.strip() != run.workload.reference:
        raise RunFailed("output differs from a run without preload", figures)
    return figures


def memory_progress(run: Run) -> str:
    """A sampled run's word in the progress line: its peak PSS."""
    peak = run.metric("peak_pss")
    return (f"{run.allocator.name}={peak / MIB:.1f}MiB" if run.ok and peak else
            f"{run.allocator.name}={run.status if not run.ok else 'no sample'}")
