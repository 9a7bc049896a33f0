"""`meshalloc bench traces`: the STEVE thesis's trace-driven comparison (§5.3, §8.3.3) on the
workloads of it that exist here. Each program is recorded once (`meshalloc trace record`, on
glibc), its trace replayed under every allocator (`meshalloc trace replay`, fast timing,
interleaved and repeated), and `meshalloc trace analyze` gives the lifetime histograms of each
trace and the ranking tables over all of them. The claims set the thesis's qualitative findings
beside ours, plus the replay's fidelity target (issue 26): on the fragmentation workload of
`make demo` and on the Redis LRU server of `bench redis-lru`, a replay at the recorded pace
gives each allocator's mean and peak PSS within ±10 % of the live run's, and the same ranking.
Redis adapts its allocations to the allocator (ALLOCATOR_ADAPTIVE), so that target is judged on
a trace recorded under each allocator, and the single glibc trace replayed under all of them
is shown beside it with its swaps and their cause. See docs/trace.md.
"""

from __future__ import annotations

import os
import statistics
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .. import paths, trace as tracing, trace_analyze, trace_replay
from ..allocators import Allocator, library_options
from ..compare import RunRecord, compare, comparison_of
from ..errors import MeshallocError
from ..measure import DEFAULT_INTERVAL_S
from ..output import write_comparison
from . import driver, redis_lru, redis_support
from .claims import claims_table
from .common import ExperimentBase, Selection, built, names_from
from .framework import (FULL, QUICK, SMOKE, STDOUT, Claim, Command, Context, Declared, ExperimentUnavailable,
                        Parameters, Pass, Report, Results, Run, RunFailed, Session)
from .programs import Prepared, available_programs
from .report import markdown_table, write_tsv
from .stats import Stat

NAME = "traces"
ALLOCATORS = ("glibc", "jemalloc", "mimalloc", "tcmalloc", "meshalloc")
SMOKE_ALLOCATORS = ("glibc", "meshalloc")
REPETITIONS = {SMOKE: 1, QUICK: 2, FULL: 3}
RECORD_TIMEOUT_S = 600
PROGRAMS_VARIABLE = "TRACES_PROGRAMS"  # narrows the run: "ls,tar,sqlite3,fragmentation,redis-lru"
ALLOCATORS_VARIABLE = "TRACES_ALLOCATORS"  # what --allocators does, as a variable
# The directory `ls -lR` lists and `tar` archives, by mode.
TREES = {SMOKE: "/usr/share/doc/coreutils", QUICK: "/usr/share/doc", FULL: "/usr/share"}
FIDELITY = "fragmentation"
REDIS_FIDELITY = "redis-lru"  # the Redis LRU server of `bench redis-lru`
REDIS_FIDELITY_RATE = 70_000  # keys per second: 12.4 s for the 870,000 keys, recorded or not
FIDELITY_TOLERANCE = 0.10  # the issue's ±10 %
# The allocator every single trace is recorded on (no preload under the recorder: glibc).
RECORDED_ON = "glibc"
# Workloads whose allocation sequence depends on the allocator: Redis evicts by its own count of
# malloc_usable_size, so the number of keys it keeps (and so every later call) follows the
# allocator's rounding. One trace fixes that number; each allocator's fidelity is measured on a
# trace recorded under it (trace_owners), and the single glibc trace is still replayed under
# every allocator (the thesis's use), shown beside it and not judged.
ALLOCATOR_ADAPTIVE = frozenset({REDIS_FIDELITY})
# Redis's steady state before its second phase (the cache full of phase-1 keys at maxmemory):
# the samples of this many seconds before the phase starts (the first phase holds it for 5 s).
PLATEAU_WINDOW_S = 2.0
# The thesis's findings for the allocators it shares with us (dlmalloc is glibc's ancestor):
# Table 9.2 ranks memory dlmalloc 1st, tcmalloc 5th, jemalloc 6th (last); Table 9.1 ranks speed
# dlmalloc 3rd, jemalloc 4th, tcmalloc 5th.
THESIS_MEMORY_ORDER = ("glibc", "tcmalloc", "jemalloc")
THESIS_SPEED_ORDER = ("glibc", "jemalloc", "tcmalloc")
# How every program's recording is replayed under every allocator: as fast as it goes, touching
# every page a block covers (`meshalloc trace replay`'s defaults).
REPLAY_TIMING, REPLAY_TOUCH = "fast", "page"


def _workloads(context: Context, tree: str, scratch: Path) -> Tuple[Dict[str, Prepared], List[str]]:
    """ls and tar over a directory tree, and the real programs of `bench real-apps` (python3,
    ruby, perl, git, and sqlite3 loading a generated SQL dump) with their inputs built."""
    if not Path(tree).is_dir():
        tree = "/usr/share/doc"
    workloads = {"ls": Prepared(["ls", "-lR", tree], scratch),
                 "tar": Prepared(["tar", "-cf", str(scratch / "tree.tar"), tree], scratch)}
    notes: List[str] = []
    if context.mode != SMOKE:
        found, missing = available_programs()
        notes += missing
        for program in found:
            work = scratch / program.name
            work.mkdir(parents=True, exist_ok=True)
            try:
                workloads[program.name] = program.prepare(context.root, work, program.scale(context))
            except Exception as error:  # a program whose input cannot be built is left out
                notes.append(f"{program.name}: input not built ({error})")
    wanted = names_from(PROGRAMS_VARIABLE)
    if wanted:
        workloads = {name: prepared for name, prepared in workloads.items() if name in wanted}
    return workloads, notes


def record(prepared: Prepared, trace: Path) -> str:
    """Runs the program under the recorder (on glibc); "" or what went wrong."""
    env = tracing.record_environment(trace, None, 0)
    env.update(prepared.env)
    for old in [trace, *tracing.child_traces(trace)]:
        old.unlink(missing_ok=True)
    try:
        completed = subprocess.run(prepared.command, cwd=prepared.cwd, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=RECORD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot record: {error}"
    if completed.returncode != 0:
        return f"recorded run exited with {completed.returncode}: {completed.stderr.decode(errors='replace')[-200:]}"
    return "" if trace.is_file() else "no trace written"


@dataclass
class Fidelity:
    """One workload run live and replayed at its recorded pace: per allocator, the live run's
    mean and peak PSS, and the replay."""

    workload: str
    live: Dict[str, Tuple[Optional[Stat], Optional[Stat]]]  # allocator -> (mean PSS, peak PSS)
    replayed: Dict[str, trace_replay.Replay]  # allocator -> the replay holding its runs (by_allocator)
    detail: str = ""  # Markdown shown after the fidelity table (redis_peak_table)
    pace: str = "recorded pace"  # how the replay was timed
    # Non-empty: shown and its ranking compared, but not judged, for this reason (the single
    # trace of an allocator-adaptive workload).
    unjudged_because: str = ""


def trace_owners(workload: str, allocators: Sequence[str]) -> Dict[str, str]:
    """Per allocator, the allocator whose recording of the workload its fidelity replay runs:
    its own for an allocator-adaptive workload (ALLOCATOR_ADAPTIVE), else the one RECORDED_ON."""
    return {name: name if workload in ALLOCATOR_ADAPTIVE else RECORDED_ON for name in allocators}


def by_allocator(replays: Sequence[trace_replay.Replay]) -> Dict[str, trace_replay.Replay]:
    """Each allocator's replay among replays of different traces (or of one trace)."""
    return {allocator.name: replayed for replayed in replays for allocator in replayed.comparison.allocators}


def replay_owned(traces: Dict[str, Path], owners: Dict[str, str], allocators, out: Path, repetitions: int,
                 warps: Dict[str, list]) -> Dict[str, trace_replay.Replay]:
    """Replays each recording under the allocators that own it (trace_owners), at the recorded
    pace (warped where `warps` says), interleaved among those allocators; its results under
    out/replay (one trace) or out/replay-<owner> (one per allocator)."""
    replays = []
    for owner in dict.fromkeys(owners[allocator.name] for allocator in allocators):
        mine = [allocator for allocator in allocators if owners[allocator.name] == owner]
        where = out / ("replay" if len(set(owners.values())) == 1 else f"replay-{driver.slug(owner)}")
        replayed = trace_replay.replay(traces[owner], mine, where, repetitions, timing="recorded",
                                       warp=warps.get(owner, []))
        trace_replay.write_results(replayed, where)
        replays.append(replayed)
    return by_allocator(replays)


def own_bytes(replayed: trace_replay.Replay, allocator: str) -> float:
    """The replayer's own tables in one allocator's replays (median): its slot table holds a
    pointer per live block where the program kept its own pointers, which the trace replays
    as blocks, so this is the one part of a replay's PSS the program never had."""
    values = [times.own_bytes for (name, _), times in replayed.times.items() if name == allocator]
    return statistics.median(values) if values else 0.0


def ordered_pairs(stats: Dict[str, Optional[Stat]]) -> List[Tuple[str, str]]:
    """The pairs (lower, higher) whose ranges over the repetitions do not overlap: the only
    orders the live runs establish. Two allocators whose runs interleave (mimalloc and tcmalloc
    0.2 % apart on the fragmentation workload's mean) are tied, and either order is theirs."""
    present = sorted((stat.median, name, stat) for name, stat in stats.items() if stat)
    return [(a, b) for i, (_, a, low) in enumerate(present) for _, b, high in present[i + 1:] if low.high < high.low]


def judge(fidelities: Sequence[Fidelity], allocators, repetitions: int) -> Tuple[List[Claim], str]:
    """The table of live against replayed PSS, and two claims per judged workload: every figure
    within ±10 % once the replayer's own tables are taken out of the replay (both columns shown),
    and the same ranking wherever the live runs establish one (ordered_pairs), naming the pairs
    that swap. An unjudged one (Fidelity.unjudged_because) gets its ranking line only, with
    the reason. A missing figure leaves a claim unjudged."""
    rows, claims = [], []
    for fidelity in fidelities:
        replay_rows = {row.allocator: row for name, replayed in fidelity.replayed.items()
                       for row in replayed.comparison.rows if row.allocator == name}
        worst, worst_raw, complete = 0.0, 0.0, True
        for allocator in allocators:
            replayed = fidelity.replayed.get(allocator.name)
            own = own_bytes(replayed, allocator.name) if replayed else 0.0
            cells = [fidelity.workload, allocator.name]
            live = dict(zip(("mean_pss", "peak_pss"), fidelity.live.get(allocator.name, (None, None))))
            for metric in ("mean_pss", "peak_pss"):
                a = live[metric]
                row = replay_rows.get(allocator.name)
                b = getattr(row, metric) if row else None
                if a is None or b is None or a.median <= 0:
                    complete = False
                    cells += ["—"] * 4
                    continue
                raw = b.median / a.median - 1
                error = (b.median - own) / a.median - 1
                worst, worst_raw = max(worst, abs(error)), max(worst_raw, abs(raw))
                cells += [f"{a.median / (1 << 20):.1f}", f"{b.median / (1 << 20):.1f}", f"{raw * 100:+.1f} %",
                          f"{error * 100:+.1f} %"]
            cells.append(f"{own / (1 << 20):.1f}")
            rows.append(cells)

        def order(stats: Dict[str, Optional[Stat]]) -> List[str]:
            return [name for _, name in sorted((stat.median, name) for name, stat in stats.items() if stat)]

        kept = separated = tied = 0
        swapped: List[str] = []
        for index, metric in enumerate(("mean_pss", "peak_pss")):
            live_stats = {name: pair[index] for name, pair in fidelity.live.items()}
            replay_stats = {name: getattr(row, metric) for name, row in replay_rows.items()}
            pairs = ordered_pairs(live_stats)
            for low, high in pairs:
                if replay_stats.get(low) and replay_stats.get(high) \
                        and replay_stats[low].median < replay_stats[high].median:
                    kept += 1
                else:
                    swapped.append(f"{low} < {high} ({metric.split('_')[0]})")
            separated += len(pairs)
            measured = sum(1 for stat in live_stats.values() if stat)
            tied += measured * (measured - 1) // 2 - len(pairs)
            if metric == "mean_pss":
                ranking = ("live " + " < ".join(order(live_stats)) + "; replay " + " < ".join(order(replay_stats)))
        ranking += (f"; {kept} of the {separated} pairs the live runs order (mean and peak) keep their order, "
                    f"{tied} pairs are within the live runs' spread")
        ranking += ("; live order not kept: " + ", ".join(swapped)) if swapped else ""
        same = kept == separated
        if fidelity.unjudged_because:
            claims.append(Claim(f"replay of {fidelity.workload}: allocators ranked as live (mean and peak PSS)",
                                "shown beside the judged replay", ranking + f"; figures worst {worst * 100:.1f} % "
                                "off without the replayer's own tables", None, fidelity.unjudged_because))
            continue
        claims.append(Claim(f"replay of {fidelity.workload} ({fidelity.pace}): mean and peak PSS of every allocator "
                            "vs live, without the replayer's own tables", "within ±10 % (issue 26)",
                            f"worst {worst * 100:.1f} % off ({worst_raw * 100:.1f} % with them; "
                            f"{repetitions} runs each)", worst <= FIDELITY_TOLERANCE if complete else None))
        claims.append(Claim(f"replay of {fidelity.workload}: allocators ranked the same as live (mean and peak PSS), "
                            "wherever the live runs rank them", "same ranking (issue 26)", ranking,
                            same if complete else None))
    table = markdown_table(["workload", "allocator", "live mean PSS MiB", "replay mean PSS MiB", "mean Δ",
                            "mean Δ without own", "live peak PSS MiB", "replay peak PSS MiB", "peak Δ",
                            "peak Δ without own", "replayer's own MiB"], rows, left=2)
    table += ("\n\"without own\": the replay's PSS minus the replayer's own tables (its slot table, a pointer per "
              "live block, and buffers), which the recorded program did not have; the program's own pointer arrays "
              "are in the trace as blocks and stay in.\n")
    table += "".join("\n" + fidelity.detail for fidelity in fidelities if fidelity.detail)
    return claims, table


def plateau_and_growth(samples, phase2_start_s: float) -> Optional[Tuple[float, float]]:
    """A Redis run's PSS in its steady state before the second phase (the mean of the samples
    in the PLATEAU_WINDOW_S before the phase starts: the cache full of phase-1 keys) and how far
    its peak rises above that. The second phase's rise is where the allocators differ (the small
    values evicted leave sparse spans behind, until meshing or reuse reclaims them), so a
    replay's peak error splits into an offset already there at the plateau and a different
    rise. None without samples in the window."""
    before = [sample.pss for sample in samples if phase2_start_s - PLATEAU_WINDOW_S <= sample.time < phase2_start_s]
    if not before:
        return None
    plateau = statistics.mean(before)
    return plateau, max(sample.pss for sample in samples) - plateau


def phase2_start(run: redis_support.Run) -> Optional[float]:
    """When the client's second phase began, in seconds since the server started."""
    phase1 = run.client.get("phase1_s")
    return run.client_start_s + float(phase1) if phase1 is not None and run.client_start_s is not None else None


def phase_marks(run: redis_support.Run) -> Optional[Tuple[float, float, float]]:
    """When the client started, ended its first phase and ended its second, in seconds since
    the server started; None when the run did not report them."""
    try:
        start, first, second = run.client_start_s, float(run.client["phase1_s"]), float(run.client["phase2_s"])
    except (KeyError, ValueError):
        return None
    if start is None or not (start > 0 and first > 0 and second > 0):
        return None
    return start, start + first, start + first + second


def live_pace_warp(recording: redis_support.Run, live_runs: Sequence[redis_support.Run]) -> List[Tuple[float, float]]:
    """The replay's --warp that gives the recorded run the live runs' pace: the recorded client's
    start and phase ends onto the medians of the live runs' (every allocator's: the program's
    pace on this machine now). The first phase is paced by the client (REDIS_FIDELITY_RATE) and
    barely moves; the second, as fast as the server evicts, ran 2.4-5.3 s in the live runs and
    the recording on a loaded machine, and a replay at the recorded pace of a slow recording
    spent longer at the second phase's heights (means up to 11.5 % high). Empty (the recorded
    pace) when either side lacks the marks."""
    recorded = phase_marks(recording)
    live = [marks for marks in (phase_marks(run) for run in live_runs if run.served) if marks]
    if recorded is None or not live:
        return []
    target = [statistics.median(marks[index] for marks in live) for index in range(3)]
    return list(zip(recorded, target))


def redis_peak_table(recordings: Dict[str, redis_support.Run], live_runs: Sequence[redis_support.Run],
                     replayed: Dict[str, trace_replay.Replay], title: str) -> str:
    """Per allocator, live and replayed: the plateau before the second phase, the peak's rise
    above it, and the keys the server held at the end of the live runs and of the recording its
    replay ran (`recordings`: allocator -> recorded run; Redis evicts by its own count of
    malloc_usable_size, so it keeps fewer keys under an allocator that rounds sizes up more, and
    a trace keeps the count of the allocator it was recorded under). Medians (min-max), MiB."""
    rows = []
    for allocator, replay_of in replayed.items():
        recording = recordings[allocator]
        replay_start, recorded_keys = phase2_start(recording), recording.metric("keys")
        live = [plateau_and_growth(run.result.samples, phase2_start(run)) for run in live_runs
                if run.config.name == allocator and run.served and run.result and phase2_start(run) is not None]
        replay = [plateau_and_growth(run.result.samples, replay_start) for run in replay_of.comparison.runs
                  if run.allocator == allocator and run.result.succeeded and replay_start is not None]
        live, replay = [split for split in live if split], [split for split in replay if split]
        keys = Stat.of(run.metric("keys") for run in live_runs if run.config.name == allocator and run.served)
        cells = [allocator]
        for index in (0, 1):
            for splits in (live, replay):
                stat = Stat.of(split[index] / (1 << 20) for split in splits)
                cells.append(f"{stat.median:.1f} ({stat.low:.1f}–{stat.high:.1f})" if stat else "—")
        cells.append(f"{own_bytes(replay_of, allocator) / (1 << 20):.1f}")
        cells.append(f"{keys.median:,.0f} ({(keys.median / recorded_keys - 1) * 100:+.1f} %)"
                     if keys and recorded_keys else "—")
        cells.append(f"{recorded_keys:,.0f} ({recording.config.name})" if recorded_keys else "—")
        rows.append(cells)
    return (f"{title}: the peak split into the plateau before the second phase (the {PLATEAU_WINDOW_S:g} s "
            "before it) and the rise above it, MiB, medians (min–max); the keys the live servers held at the end "
            "(Δ against the trace's), and those of the recorded run whose trace was replayed:\n\n"
            + markdown_table(["allocator", "live plateau", "replay plateau", "live rise to peak", "replay rise to peak",
                              "replayer's own", "live keys at end", "trace's keys (recorded under)"], rows, left=1))


def key_shift(recording: redis_support.Run, live_runs: Sequence[redis_support.Run]) -> str:
    """How many keys each allocator's live servers kept against the one recording (medians):
    why a single trace of Redis cannot rank the allocators as live."""
    recorded = recording.metric("keys")
    shifts = []
    for name in dict.fromkeys(run.config.name for run in live_runs):
        keys = Stat.of(run.metric("keys") for run in live_runs if run.config.name == name and run.served)
        if keys and recorded:
            shifts.append(f"{name} {(keys.median / recorded - 1) * 100:+.1f} %")
    return (f"Redis evicts by malloc_usable_size, so its key count follows the allocator: the live servers kept "
            f"{', '.join(shifts) or 'unknown'} keys against the {recording.config.name} trace's "
            f"{recorded or 0:,.0f}, which every replay of that one trace keeps")


def fragmentation_fidelity(context: Context, allocators, repetitions: int) -> Tuple[List[Fidelity], List[str]]:
    """The fragmentation workload of `make demo`, live and replayed, one after the other."""
    program = context.build_dir / "tools" / "workloads" / "fragmentation"
    if not program.is_file():
        return [], [f"{FIDELITY}: tools/workloads/fragmentation is not built"]
    out = context.out / FIDELITY
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "fragmentation.trace"
    problem = record(Prepared([str(program)], out), trace)
    if problem:
        return [], [f"{FIDELITY}: {problem}"]
    live = compare([str(program)], allocators, repeat=repetitions, log_dir=out / "live-logs")
    # Not allocator-adaptive: every allocator owns the one recording (trace_owners).
    owners = trace_owners(FIDELITY, [allocator.name for allocator in allocators])
    replayed = replay_owned({RECORDED_ON: trace}, owners, allocators, out, repetitions, {})
    (out / "live").mkdir(exist_ok=True)
    write_comparison(live, out / "live")
    return [Fidelity(FIDELITY, {row.allocator: (row.mean_pss, row.peak_pss) for row in live.rows}, replayed)], []


def record_redis(load, install, client, allocator: Optional[Allocator], out: Path,
                 log) -> Tuple[Optional[redis_support.Run], Path, str]:
    """One sampled run of the Redis server under the recorder, on `allocator` (None: glibc,
    nothing preloaded after the recorder): the run, its trace, and "" or what went wrong."""
    name = allocator.name if allocator else RECORDED_ON
    trace = out / f"redis-{driver.slug(name)}.trace"
    trace.unlink(missing_ok=True)
    # glibc: nothing preloaded under the recorder (and no LD_PRELOAD inherited from the caller).
    underneath = allocator or Allocator(RECORDED_ON, None, "glibc, nothing preloaded")
    # The recorder's variables as `meshalloc trace record -a` sets them: the recorder first in
    # LD_PRELOAD, the allocator's library after it.
    recording_env = tracing.record_environment(trace, underneath, callsites=0)
    recorder = Allocator(f"{name}+recorder", None, f"{name}, recorded",
                         set_env={**underneath.set_env, tracing.ENV_FILE: recording_env[tracing.ENV_FILE],
                                  "LD_PRELOAD": recording_env["LD_PRELOAD"]}, unset_env=underneath.unset_env)
    recording = redis_support.Run(redis_support.Config(name, install.libc_server, recorder), 1, 1,
                                  out / f"recording-{driver.slug(name)}")
    recording.directory.mkdir(parents=True, exist_ok=True)
    log(f"recording {REDIS_FIDELITY} under {name} ({load.hold_s:g} s)")
    measured = driver.measure_run(redis_support.sampled_command(recording, load, install, client), recording.config,
                                  recording.directory)
    measured.client = recording
    redis_support.sampled_record(measured)
    # Fidelity makes no unsampled timing run: Run.served, not Run.ok.
    if not recording.served or not trace.is_file():
        return None, trace, f"{REDIS_FIDELITY}: the run recorded under {name} failed: " \
            + "; ".join(recording.problems or ["no trace"])
    return recording, trace, ""


def redis_fidelity(context: Context, allocators, repetitions: int) -> Tuple[List[Fidelity], List[str]]:
    """The Redis LRU server of `bench redis-lru` (its MALLOC=libc build, every allocator
    preloaded as in the replay), run live under every allocator and recorded once on glibc and,
    since it is allocator-adaptive (ALLOCATOR_ADAPTIVE), once under each other allocator. Two
    fidelities: each allocator replaying its own trace (judged), and every allocator replaying
    the glibc trace (shown, with why its ranking differs)."""
    try:
        install = redis_support.ensure_source_build(context.root, context.log)
        client = redis_support.compile_client(context.root)
    except MeshallocError as error:
        return [], [f"{REDIS_FIDELITY}: no Redis build ({error})"]
    if install.libc_server is None:
        return [], [f"{REDIS_FIDELITY}: needs the MALLOC=libc build ({redis_support.BUILD_SCRIPT})"]
    # Paced: unpaced, the insertion runs at the server's speed, which the recorder slows (12.3 s
    # recorded against 5.5-7.6 s live, on a loaded machine), and a replay at the recorded pace
    # then spends longer inserting and less time at the plateau than any live run.
    load = replace(redis_lru.workload(context.mode), rate=REDIS_FIDELITY_RATE)
    out = context.out / REDIS_FIDELITY
    out.mkdir(parents=True, exist_ok=True)
    owners = trace_owners(REDIS_FIDELITY, [allocator.name for allocator in allocators])
    by_name = {allocator.name: allocator for allocator in allocators}
    recordings: Dict[str, redis_support.Run] = {}
    traces: Dict[str, Path] = {}
    notes: List[str] = []
    # The glibc recording always (the single-trace replay), then any other owner's.
    for owner in dict.fromkeys([RECORDED_ON, *owners.values()]):
        made, trace, problem = record_redis(load, install, client, None if owner == RECORDED_ON else by_name[owner],
                                            out, context.log)
        if problem:
            notes.append(problem)
        else:
            recordings[owner], traces[owner] = made, trace
    if RECORDED_ON not in recordings:
        return [], notes
    configs = [redis_support.Config(allocator.name, install.libc_server, allocator,
                                    meshalloc=bool(allocator.library and library_options(allocator.library)))
               for allocator in allocators]

    def command_of(made: Run, kind: str) -> Command:
        record = redis_support.Run(made.allocator, made.repetition, made.order, made.directory)
        return redis_support.sampled_command(record, load, install, client)

    def finish(measured: Run) -> None:
        measured.figures["record"] = redis_support.sampled_record(measured)

    done = driver.run_schedule([load], configs, Pass("", repetitions), command_of,
                               lambda slot, kind: (out / "live" / f"{slot.allocator.slug}-r{slot.repetition}", None),
                               finish=finish, log=context.log,
                               describe=lambda measured: f"{measured.allocator.name} "
                               + ("ok" if measured.figures["record"].served else "FAILED"),
                               group=lambda slot: f"{REDIS_FIDELITY} live [{slot.repetition}/{repetitions}]")
    runs = [measured.figures["record"] for measured in done]
    notes += [f"{REDIS_FIDELITY}: live {run.config.name} #{run.repetition}: " + "; ".join(run.problems)
              for run in runs if not run.served]
    live = {config.name: tuple(Stat.of(run.metric(metric) for run in runs if run.config is config and run.served)
                               for metric in ("mean_pss", "peak_pss")) for config in configs}
    warps = {owner: live_pace_warp(recording, runs) for owner, recording in recordings.items()}
    fidelities = []
    # Judged: each allocator on its own trace (those whose recording failed are left out, and
    # the claims go unjudged). Shown: every allocator on the glibc trace.
    owned = [allocator for allocator in allocators if owners[allocator.name] in traces]
    single = {allocator.name: RECORDED_ON for allocator in allocators}
    for mapping, movers, label, directory, why in (
            (owners, owned, f"{REDIS_FIDELITY}, own traces", "own-traces", ""),
            (single, allocators, f"{REDIS_FIDELITY}, one {RECORDED_ON} trace", "one-trace",
             key_shift(recordings[RECORDED_ON], runs))):
        if mapping is single and set(owners.values()) == {RECORDED_ON}:
            continue  # not adaptive after all: the judged replay is this one
        replayed = replay_owned(traces, mapping, movers, out / directory, repetitions, warps)
        pace = "; ".join(f"{owner}'s trace `--warp " + ",".join(f"{a:.2f}:{b:.2f}" for a, b in warps[owner]) + "`"
                         for owner in dict.fromkeys(mapping[a.name] for a in movers) if warps.get(owner))
        detail = (f"{label}: replayed at the live runs' pace ({pace}: the recorded client's start and phase ends "
                  "onto the live runs' medians, seconds)" if pace else f"{label}: replayed at the recorded pace")
        fidelities.append(Fidelity(label, live, replayed, f"{detail}.\n\n"
                                   + redis_peak_table({a: recordings[mapping[a]] for a in replayed}, runs, replayed,
                                                      label),
                                   "the live runs' pace" if pace else "recorded pace", why))
    return fidelities, notes


def _position(names: Sequence[str], table: Dict[str, Dict[str, float]]) -> List[str]:
    """The allocators of `names` in the table's order (sorted by penalty (c))."""
    return [name for name in table if name in names]


@dataclass(frozen=True)
class TracesParameters(Parameters):
    tree: str = ""  # the directory `ls -lR` lists and `tar` archives


@dataclass(frozen=True)
class Program:
    """A workload: a program, ready to be recorded."""

    name: str
    prepared: Prepared


@dataclass
class Recording:
    """What prepare() leaves for a program: its trace, and the trace made ready to replay."""

    trace: Path
    ready: trace_replay.Prepared


class Traces(ExperimentBase, Declared):
    """The programs are the workloads: prepare() records each one once (on glibc), and each run
    replays its recording under one allocator (fast timing); the analysis, the rankings and the
    fidelity of a replay at the recorded pace (quick and full) come after."""

    allocators = ALLOCATORS
    smoke_allocators = SMOKE_ALLOCATORS
    alias = ALLOCATORS_VARIABLE
    machine_note = False
    run_directory = "replays"

    def parameters(self, mode: str) -> TracesParameters:
        return TracesParameters(REPETITIONS[mode], tree=TREES[mode])

    def select(self, session: Session) -> Selection:
        context = session.context
        for product in (paths.TRACE_RECORDER_LIBRARY, paths.TRACE_REPLAYER, paths.TRACE_REPLAY_PREPARE):
            built(context, product)
        os.environ.setdefault("MESHALLOC_BUILD_DIR", str(context.build_dir))
        selection = super().select(session)
        if len(selection.allocators) < 2:
            raise ExperimentUnavailable("a ranking needs two allocators; only " + ", ".join(selection.names) +
                                        " can run")
        return selection

    def workloads(self, session: Session) -> List[Program]:
        scratch = session.out / "work"
        scratch.mkdir(parents=True, exist_ok=True)
        workloads, notes = _workloads(session.context, session.params.tree, scratch)
        session.notes += notes
        return [Program(name, prepared) for name, prepared in workloads.items()]

    def prepare(self, session: Session, workload: Program) -> Recording:
        trace = session.out / workload.name / f"{workload.name}.trace"
        trace.parent.mkdir(parents=True, exist_ok=True)
        session.context.log(f"recording {workload.name}: {' '.join(workload.prepared.command)}")
        problem = record(workload.prepared, trace)
        if problem:
            raise RunFailed(problem)
        # A program started by a script (git_history.sh) does its work in exec'd children: the
        # largest of the files is the program's trace.
        files = [trace, *tracing.child_traces(trace)]
        trace = max(files, key=lambda path: path.stat().st_size)
        if len(files) > 1:
            session.notes.append(f"{workload.name}: {len(files)} processes recorded; replayed the largest trace, "
                                 f"{trace.name}")
        try:
            ready = trace_replay.prepare(trace, session.out / workload.name / "replay"
                                         / trace_replay.PREPARED_DIRECTORY)
        except MeshallocError as error:
            raise RunFailed(str(error)) from None
        return Recording(trace, ready)

    def command(self, session: Session, workload: Program, allocator: Allocator) -> Command:
        ready = session.prepared[workload.name].ready
        return Command(trace_replay.replay_command(ready, REPLAY_TIMING, REPLAY_TOUCH, 1.0), timeout_s=None)

    def replays(self, session: Session, results: Results) -> List[Tuple[Program, trace_replay.Replay]]:
        """Each program's replays as `meshalloc trace replay` leaves them (its directory's files
        written), in the order of the programs."""
        if "replays" not in session.state:
            found = []
            for program in results.workloads:
                mine = [run for run in results.runs if run.workload is program]
                records = [RunRecord(run.allocator.name, run.repetition, index, run.result, run.directory / STDOUT)
                           for index, run in enumerate(mine, 1) if run.result is not None]
                recording = session.prepared[program.name]
                comparison = comparison_of(trace_replay.replay_command(recording.ready, REPLAY_TIMING, REPLAY_TOUCH,
                                                                       1.0), results.allocators,
                                           results.repetitions, DEFAULT_INTERVAL_S, records)
                replayed = trace_replay.replay_result(recording.ready, comparison, REPLAY_TIMING, REPLAY_TOUCH)
                trace_replay.write_results(replayed, session.out / program.name / "replay",
                                           figures=session.context.mode != SMOKE)
                found.append((program, replayed))
            session.state["replays"] = found
        return session.state["replays"]

    def analysis(self, session: Session, results: Results):
        """The lifetime analysis of every trace, the rankings over all of them and the fidelity
        runs (quick and full: the live runs and replays at the recorded pace are this claim's own
        measurements, made after the schedule), computed once."""
        if "analysis" in session.state:
            return session.state["analysis"]
        context, repetitions = session.context, results.repetitions
        files: List[Path] = []
        shares = []
        replays = self.replays(session, results)
        for program, replayed in replays:
            _, written, blocks = trace_analyze.analyze(session.prepared[program.name].trace,
                                                       session.out / program.name / "analysis",
                                                       [replayed.prepared.directory.parent],
                                                       figures=context.mode != SMOKE)
            files += written
            shares.append((program.name, trace_analyze.short_lived_share(blocks), len(blocks.records)))
        ranked = trace_analyze.rankings([trace_analyze.load_replay(replayed.prepared.directory.parent)
                                         for _, replayed in replays])
        headers, rows = trace_analyze.ranking_rows(ranked) if ranked else ([], [])
        files.append(session.out / "rankings.tsv")
        write_tsv(files[-1], headers, rows)
        claims = self.thesis_claims(ranked, shares)
        if context.mode == SMOKE:  # a few hundred blocks of `ls` and `tar` prove nothing
            claims = [replace(claim, holds=None, note="smoke run: not judged") for claim in claims]
        fidelity_table = ""
        if context.mode != SMOKE:
            fidelities = []
            wanted = names_from(PROGRAMS_VARIABLE)
            for name, measure_one in ((FIDELITY, fragmentation_fidelity), (REDIS_FIDELITY, redis_fidelity)):
                if wanted and name not in wanted:
                    continue
                found, more_notes = measure_one(context, results.allocators, repetitions)
                session.notes += more_notes
                fidelities += found
            if fidelities:
                more, fidelity_table = judge(fidelities, results.allocators, repetitions)
                claims += more
        share_table = markdown_table(["trace", "blocks", f"short-lived (< {trace_analyze.SHORT_LIVED_PERCENT:g} % "
                                      "of the calls)"], [[name, f"{count:,}", f"{share:.1f} %"]
                                                         for name, share, count in shares])
        ranking_md = markdown_table(headers, rows, left=2) if rows else \
            "No ranking: fewer than two allocators replayed every trace.\n"
        table_md = (f"Rankings over {len(replays)} traces ({', '.join(program.name for program, _ in replays)}), "
                    f"{repetitions} replay(s) per allocator, fast timing:\n\n" + ranking_md + "\n" + share_table)
        if fidelity_table:
            table_md += "\nFidelity (live vs replay at the recorded pace, or the live runs' where noted; medians):\n\n" + fidelity_table
        session.state["analysis"] = claims, table_md, files
        return session.state["analysis"]

    def claims(self, session: Session, results: Results) -> List[Claim]:
        return self.analysis(session, results)[0]

    def report(self, session: Session, results: Results, found: Sequence[Claim]) -> Report:
        _, table_md, files = self.analysis(session, results)
        return Report(table_md, table_md + "\n" + claims_table(list(found), "thesis / issue"), files)

    @staticmethod
    def thesis_claims(ranked, shares) -> List[Claim]:
        found: List[Claim] = []
        median_share = statistics.median(share for _, share, _ in shares)
        found.append(Claim("short-lived blocks dominate (figure 5.1)", "short-lived objects dominate",
                           f"median {median_share:.0f} % of blocks die within 1 % of the run's calls "
                           f"({', '.join(f'{name} {share:.0f} %' for name, share, _ in shares)})",
                           median_share > 50.0))
        for table, thesis, what in (("space", THESIS_MEMORY_ORDER, "memory (Table 9.2)"),
                                    ("speed", THESIS_SPEED_ORDER, "speed (Table 9.1)")):
            ours = _position(thesis, ranked.get(table, {}))
            checkable = len(ours) == len(thesis)
            best = next(iter(ranked.get(table, {})), "—")
            found.append(Claim(f"order on {what} of {', '.join(thesis)} by penalty (c)", " < ".join(thesis),
                               " < ".join(ours) + f" (best of all: {best})",
                               ours == list(thesis) if checkable else None,
                               "" if checkable else "not every allocator ran"))
        return found


EXPERIMENT = Traces(name=NAME, title="Trace-driven allocator ranking", paper="STEVE thesis §5.3, §8.3.3")
