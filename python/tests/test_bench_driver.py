"""The driver of declared experiments (bench/driver.py) on a toy experiment declared here: a
tiny Python command under two allocators (no preload, and libm preloaded, which changes
nothing), one workload that fails under one allocator and one whose output is wrong. Checks
the schedule's order, runs.tsv, table.tsv, table.md, the failure lines (the other runs still
ran), --repeat, claims judged outside smoke mode, and the SUMMARY.md rows of a run through the
runner. Seconds in all."""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from bench_support import ROOT, read_tsv

from meshalloc_cli import bench
from meshalloc_cli.bench import runner
from meshalloc_cli.bench.claims import Claims
from meshalloc_cli.bench.common import ExperimentBase
from meshalloc_cli.bench.framework import (QUICK, SMOKE, TIMED, Column, Command, Context, Declared, Parameters, Pass,
                                           RunFailed)
from meshalloc_cli.bench.schedule import INTERLEAVED, ROTATED

SYSTEM = "system"


def harmless_library() -> str:
    """A library whose preload changes no allocator: libm, wherever this system keeps it."""
    for directory in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                      "/usr/lib", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"):
        candidate = Path(directory) / "libm.so.6"
        if candidate.is_file():
            return str(candidate)
    pytest.skip("no libm.so.6 to preload")


@dataclass(frozen=True)
class ToyParameters(Parameters):
    value: int = 0


class Toy(ExperimentBase, Declared):
    allocators = (SYSTEM,)
    baselines = (SYSTEM,)
    workload_heading = "case"
    run_columns = ("value",)
    columns = (Column("value", "value", decimals=1, ratio=True),)
    order = INTERLEAVED

    def parameters(self, mode):
        return ToyParameters(repetitions=2, order=self.order, value={SMOKE: 3, QUICK: 5}.get(mode, 7))

    def workloads(self, session):
        return ["good", "crashes", "mute"]

    def command(self, session, workload, allocator):
        # "crashes" exits 3 without preload only; "mute" prints no result line; under the
        # preload the value doubles, so that the ratio column has something to show.
        value = session.params.value * (1 if allocator.name == SYSTEM else 2)
        code = {"crashes": "raise SystemExit(3)" if allocator.name == SYSTEM else f"print('value={value}')",
                "mute": "pass"}.get(workload, f"print('value={value}')")
        return Command([sys.executable, "-c", code], measure=TIMED, timeout_s=30)

    def parse(self, session, run):
        found = re.search(r"value=(\d+)", run.stdout)
        if found is None:
            raise RunFailed("no value= line")
        return {"value": int(found.group(1))}

    def claims(self, session, results):
        found = Claims(session.checked)
        other = [name for name in results.names if name != SYSTEM][0]
        doubled = results.ratio("good", other, "value")
        found.add("the preload doubles the value", "2×", f"{doubled}×", doubled == 2.0 if doubled else None)
        return found.found


@pytest.fixture
def library():
    return harmless_library()


def drive(tmp_path, library, mode=QUICK, repeat=None, order=INTERLEAVED):
    experiment = Toy(name="toy", title="Toy", paper="none")
    experiment.order = order
    lines = []
    out = tmp_path / "toy"
    out.mkdir(parents=True)
    context = Context(mode=mode, out=out, root=ROOT, build_dir=tmp_path / "no-build", repeat=repeat,
                      log=lines.append, allocators=(SYSTEM, library))
    return experiment.run(context), out, lines


def test_runs_failures_and_tables(tmp_path, library):
    outcome, out, lines = drive(tmp_path, library)
    assert outcome.repetitions == 2
    # A failing run is one failure line; every other run still ran.
    assert outcome.failures == [f"crashes under {SYSTEM} (repetition 1): exit 3",
                                f"crashes under {SYSTEM} (repetition 2): exit 3",
                                f"mute under {SYSTEM} (repetition 1): no value= line",
                                f"mute under {library} (repetition 1): no value= line",
                                f"mute under {SYSTEM} (repetition 2): no value= line",
                                f"mute under {library} (repetition 2): no value= line"]
    header, runs = read_tsv(out / "runs.tsv")
    assert header == ["case", "allocator", "repetition", "order", "status", "value"]
    assert len(runs) == 12
    good = {(run["allocator"], run["repetition"]): run["value"] for run in runs if run["case"] == "good"}
    assert good == {(SYSTEM, "1"): "5", (library, "1"): "10", (SYSTEM, "2"): "5", (library, "2"): "10"}
    assert [run["status"] for run in runs if run["case"] == "crashes"] == ["exit 3", "ok", "exit 3", "ok"]

    header, table = read_tsv(out / "table.tsv")
    assert header == ["case", "allocator", "runs", "succeeded", "value", "value_min", "value_max",
                      f"value_ratio_to_{SYSTEM}"]
    rows = {(row["case"], row["allocator"]): row for row in table}
    assert rows[("good", library)]["value_ratio_to_system"] == "2"
    assert rows[("crashes", SYSTEM)]["succeeded"] == "0" and rows[("crashes", SYSTEM)]["value"] == ""
    assert rows[("crashes", library)]["value"] == "10"

    markdown = (out / "table.md").read_text()
    assert f"| good | {library} | 2/2 | 10.0 |" in markdown and "| crashes | system | 0/2 | — |" in markdown
    assert f"- failed: crashes under {SYSTEM} (repetition 1): exit 3" in markdown
    assert [claim.holds for claim in outcome.claims] == [True]
    assert {path.name for path in outcome.files} >= {"runs.tsv", "table.tsv", "table.md", "runs"}
    assert (out / "runs" / "good" / "system-r1" / "stdout.txt").read_text() == "value=5\n"
    assert any(line.startswith("good [1/2]") for line in lines)


def schedule_of(out: Path):
    _, runs = read_tsv(out / "runs.tsv")
    return [(run["case"], run["allocator"], run["repetition"]) for run in sorted(runs, key=lambda r: int(r["order"]))]


def test_schedule_order_interleaved_and_rotated(tmp_path, library):
    _, out, _ = drive(tmp_path / "interleaved", library)
    assert schedule_of(out)[:4] == [("good", SYSTEM, "1"), ("good", library, "1"),
                                    ("good", SYSTEM, "2"), ("good", library, "2")]
    _, out, _ = drive(tmp_path / "rotated", library, order=ROTATED)
    assert schedule_of(out)[:4] == [("good", SYSTEM, "1"), ("good", library, "1"),
                                    ("good", library, "2"), ("good", SYSTEM, "2")]


def test_repeat_and_smoke(tmp_path, library):
    outcome, out, _ = drive(tmp_path, library, mode=SMOKE, repeat=3)
    assert outcome.repetitions == 3
    _, runs = read_tsv(out / "runs.tsv")
    assert {run["value"] for run in runs if run["case"] == "good" and run["allocator"] == SYSTEM} == {"3"}
    assert len(runs) == 18
    assert [claim.holds for claim in outcome.claims] == [None]  # smoke: never judged


def test_summary_rows_through_the_runner(tmp_path, library, monkeypatch):
    module = types.ModuleType("meshalloc_cli.bench.fake_toy")
    module.EXPERIMENT = Toy(name="toy", title="Toy", paper="none")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(bench, "EXPERIMENT_MODULES", {"toy": "fake_toy"})
    report = runner.run_bench(["toy"], QUICK, tmp_path, allocators=(SYSTEM, library))
    assert report.exit_code == 0
    outcome = json.loads((tmp_path / "toy" / "outcome.json").read_text())
    assert outcome["files"] == ["runs.tsv", "table.tsv", "table.md", "runs"]
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert f"- failed run: crashes under {SYSTEM} (repetition 2): exit 3" in summary
    assert "| case | allocator | succeeded | value |" in summary
    assert "| the preload doubles the value | 2× | 2.0× | ✓ |" in summary


class TwoPasses(Toy):
    """The toy in two passes, as speed runs: a timed one, then a second of its own order,
    repetitions and directory, whose command says which pass it is in."""

    def passes(self, params):
        return [Pass("first", params.repetitions), Pass("second", 3, ROTATED, directory="second")]

    def workloads(self, session):
        return ["good", "crashes"]

    def command(self, session, workload, allocator):
        if session.current_pass.name == "second":
            return Command([sys.executable, "-c", "print('value=1')"], measure=TIMED, timeout_s=30)
        return super().command(session, workload, allocator)


def test_passes(tmp_path, library):
    experiment = TwoPasses(name="toy", title="Toy", paper="none")
    out = tmp_path / "toy"
    out.mkdir()
    context = Context(mode=QUICK, out=out, root=ROOT, build_dir=tmp_path / "no-build", repeat=None,
                      log=lambda line: None, allocators=(SYSTEM, library))
    outcome = experiment.run(context)
    _, runs = read_tsv(out / "runs.tsv")
    assert len(runs) == 2 * 2 * 2 + 2 * 2 * 3  # each pass: workloads × allocators × its repetitions
    second = [(run["case"], run["allocator"], run["repetition"]) for run in runs[8:]]
    assert second[:6] == [("good", SYSTEM, "1"), ("good", library, "1"), ("good", library, "2"),
                          ("good", SYSTEM, "2"), ("good", SYSTEM, "3"), ("good", library, "3")]
    assert {run["value"] for run in runs[8:]} == {"1"}
    # Failures name their pass; the second pass's crashes case ran its own command and passed.
    assert outcome.failures == [f"first: crashes under {SYSTEM} (repetition 1): exit 3",
                                f"first: crashes under {SYSTEM} (repetition 2): exit 3"]
    assert (out / "runs" / "good" / "system-r2").is_dir() and (out / "second" / "good" / "system-r3").is_dir()
    assert [path.name for path in outcome.files][-2:] == ["runs", "second"]


# ---------------------------------------------------------------------------------------------
# A server sampled (or timed) while a client drives it, several run kinds per slot, a prepare
# step, a pass of its own allocators, and `meshalloc compare` on the same loop.

# A server of a few lines: listens on the port it is given, answers "get" with the value it
# was started with, and exits on "quit".
SERVER = """
import socket, sys
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(1)
while True:
    connection, _ = listener.accept()
    for line in connection.makefile():
        if line.strip() == "get":
            connection.sendall(f"value={sys.argv[2]}\\n".encode())
        elif line.strip() == "quit":
            print("served", flush=True)
            raise SystemExit(0)
"""


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ask(port: int, served) -> str:
    """The client: waits for the server, asks for its value, tells it to quit."""
    import socket
    import time

    deadline = time.monotonic() + 20
    while True:
        try:
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            if served.gone.is_set() or time.monotonic() > deadline:
                raise RuntimeError("the server never listened") from None
            time.sleep(0.02)
    with connection:
        connection.sendall(b"get\n")
        answer = connection.makefile().readline().strip()
        connection.sendall(b"quit\n")
    return answer


class Served(Toy):
    """One workload; each slot a sampled server run, then a timed one, each driven by a client
    that asks the server for its value (the row's value: 1 sampled, 2 timed)."""

    kinds = ("sampled", "timed")
    run_columns = ("sampled", "timed")
    columns = ()

    def workloads(self, session):
        return ["server"]

    def command(self, session, workload, allocator):
        port = free_port()
        value = 1 if session.current_kind == "sampled" else 2
        return Command([sys.executable, "-c", SERVER, str(port), str(value)], timeout_s=60,
                       measure=TIMED if session.current_kind == "timed" else "sampled",
                       client=lambda served: ask(port, served))

    def parse(self, session, run):
        sampled, timed = run.parts["sampled"], run.parts["timed"]
        assert sampled.result is not None and timed.result is None  # the first sampled, the second not
        if "served" not in run.stdout or "served" not in run.output("timed-stdout.txt"):
            raise RunFailed("a server did not print its last line")
        return {"sampled": sampled.client, "timed": timed.client}

    def claims(self, session, results):
        return []


def test_server_sampled_and_timed_while_a_client_drives_it(tmp_path, library):
    experiment = Served(name="served", title="Served", paper="none")
    out = tmp_path / "served"
    out.mkdir()
    lines = []
    context = Context(mode=QUICK, out=out, root=ROOT, build_dir=tmp_path / "no-build", repeat=1, log=lines.append,
                      allocators=(SYSTEM, library))
    outcome = experiment.run(context)
    assert outcome.failures == []
    _, runs = read_tsv(out / "runs.tsv")
    assert [(run["allocator"], run["status"], run["sampled"], run["timed"]) for run in runs] == [
        (SYSTEM, "ok", "value=1", "value=2"), (library, "ok", "value=1", "value=2")]
    directory = out / "runs" / "server" / "system-r1"
    assert (directory / "samples.tsv").is_file() and (directory / "timed-stdout.txt").read_text() == "served\n"


class Unserved(Served):
    """A client that fails: its error is the run's status, and the server is still stopped (by
    the time limit) rather than left behind."""

    def command(self, session, workload, allocator):
        port = free_port()

        def fail(served):
            ask(port, served)
            raise RuntimeError("the answer was wrong")

        return Command([sys.executable, "-c", SERVER, str(port), "1"], timeout_s=60, client=fail,
                       measure=TIMED if session.current_kind == "timed" else "sampled")

    def parse(self, session, run):
        return {}


def test_a_failing_client_fails_its_run(tmp_path):
    experiment = Unserved(name="unserved", title="Unserved", paper="none")
    out = tmp_path / "unserved"
    out.mkdir()
    context = Context(mode=QUICK, out=out, root=ROOT, build_dir=tmp_path / "no-build", repeat=1,
                      log=lambda line: None, allocators=(SYSTEM,))
    outcome = experiment.run(context)
    assert outcome.failures == [f"server under {SYSTEM} (repetition 1): client: RuntimeError: the answer was wrong"]
    _, runs = read_tsv(out / "runs.tsv")
    assert runs[0]["status"] == "client: RuntimeError: the answer was wrong"


class Prepared(Toy):
    """prepare() writes each workload's input once; its command prints it. A workload whose
    prepare() fails is left out with a failure line; the other passes run under a pass's own
    allocators (the second: the system's alone)."""

    prepared_calls = []

    def workloads(self, session):
        return ["seven", "broken", "nine"]

    def prepare(self, session, workload):
        self.prepared_calls.append(workload)
        if workload == "broken":
            raise RunFailed("cannot record it")
        path = session.scratch / f"{workload}.txt"
        path.write_text(f"value={ {'seven': 7, 'nine': 9}[workload]}\n")
        return path

    def passes(self, params):
        return [Pass("", params.repetitions), Pass("alone", 1, directory="alone",
                                                   allocators=lambda session: session.selection.allocators[:1])]

    def command(self, session, workload, allocator):
        return Command(["cat", str(session.prepared[workload])], measure=TIMED, timeout_s=30)

    def claims(self, session, results):
        return []


def test_prepare_runs_once_per_workload_before_the_schedule(tmp_path, library):
    experiment = Prepared(name="prepared", title="Prepared", paper="none")
    Prepared.prepared_calls = []
    out = tmp_path / "prepared"
    out.mkdir()
    context = Context(mode=QUICK, out=out, root=ROOT, build_dir=tmp_path / "no-build", repeat=2,
                      log=lambda line: None, allocators=(SYSTEM, library))
    outcome = experiment.run(context)
    assert Prepared.prepared_calls == ["seven", "broken", "nine"]  # once each, however many runs
    assert outcome.failures == ["broken: cannot record it"]
    _, runs = read_tsv(out / "runs.tsv")
    assert [(run["case"], run["allocator"], run["value"]) for run in runs] == [
        ("seven", SYSTEM, "7"), ("seven", library, "7"), ("seven", SYSTEM, "7"), ("seven", library, "7"),
        ("nine", SYSTEM, "9"), ("nine", library, "9"), ("nine", SYSTEM, "9"), ("nine", library, "9"),
        ("seven", SYSTEM, "7"), ("nine", SYSTEM, "9")]  # the second pass: its own allocators
    assert (out / "alone" / "nine" / "system-r1" / "stdout.txt").read_text() == "value=9\n"


def test_compare_runs_on_the_drivers_schedule(tmp_path, library):
    from meshalloc_cli.allocators import Allocator
    from meshalloc_cli.bench import driver
    from meshalloc_cli.compare import compare

    allocators = [Allocator(SYSTEM, None, "no preload"), Allocator("libm", Path(library), "libm preloaded")]
    seen = []
    comparison = compare([sys.executable, "-c", "import time; print('hi'); time.sleep(0.05)"], allocators, repeat=2,
                         log_dir=tmp_path / "logs",
                         on_start=lambda order, total, name, repetition: seen.append(("start", order, name)),
                         on_finish=lambda record, total: seen.append(("finish", record.order, record.allocator)))
    planned = driver.schedule.plan([None], allocators, 2)
    assert [(run.order, run.allocator, run.repetition) for run in comparison.runs] == [
        (slot.order, slot.allocator.name, slot.repetition) for slot in planned]
    assert [(run.allocator, run.repetition) for run in comparison.runs] == [
        (SYSTEM, 1), ("libm", 1), (SYSTEM, 2), ("libm", 2)]  # interleaved
    assert seen == [(event, order, name) for order, name in ((1, SYSTEM), (2, "libm"), (3, SYSTEM), (4, "libm"))
                    for event in ("start", "finish")]
    assert all(run.result.succeeded and run.log.read_text() == "hi\n" for run in comparison.runs)
    assert comparison.row("libm").succeeded == 2 and comparison.row(SYSTEM).mean_pss is not None
