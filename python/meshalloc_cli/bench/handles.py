"""`meshalloc bench handles`: moving objects through handles (Alaska, ASPLOS '24, §5.5 and
figure 9) beside meshing and Redis's active defragmentation, on the Redis LRU workload.

Two parts (docs/handles-bench.md):

1. **The cache.** bench/handle_cache is a key-value LRU cache server that speaks Redis's
   protocol, with Redis's allkeys-lru sampling and Redis's memory accounting, built once with
   its entries behind either malloc pointers or meshalloc handles (`--storage`). It runs the
   Redis LRU experiment's load (the same client, keys, values and `maxmemory`) beside Redis
   itself, through the same run machinery (redis_support.py: sampled run, timed run, timing
   rounds), so that one table and one figure hold Redis + jemalloc, + activedefrag,
   + meshalloc (meshing), the cache over plain allocators, and the cache over handles.
2. **The operations.** bench/handle_cache/handle_ops times mh_alloc + mh_free, mh_pin +
   mh_unpin and a random handle access against malloc + free and raw pointers, in one process
   under meshalloc, and the malloc rows under glibc and jemalloc too.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..allocators import Allocator, library_options, resolve
from ..errors import MeshallocError
from ..measure import MIB
from . import redis_lru
from .claims import Claims
from .common import KEY_VALUE, Selection, built, requested_specs, with_private_meshalloc
from .framework import (FULL, QUICK, SMOKE, TIMED, Claim, Command, Context, ExperimentUnavailable, Pass, Report,
                        Results, Session)
from .framework import Run as Measured
from .redis_support import Config, Run, compile_client
from .report import number, stat_text, write_tsv
from .stats import Stat

NAME = "handles"

SERVER_BINARY = Path("bench") / "handle_cache" / "handle_cache"
OPS_BINARY = Path("bench") / "handle_cache" / "handle_ops"

# The rows, in the order they run within a repetition and appear in the table.
REDIS_JEMALLOC = "redis+jemalloc"
REDIS_DEFRAG = "redis+jemalloc+activedefrag"
REDIS_MESH = "redis+meshalloc"
CACHE_GLIBC = "cache/malloc+glibc"
CACHE_JEMALLOC = "cache/malloc+jemalloc"
CACHE_MESH = "cache/malloc+meshalloc"
CACHE_HANDLES = "cache/handles+meshalloc"
BASELINE = REDIS_JEMALLOC
CONFIG_ORDER = (REDIS_JEMALLOC, REDIS_DEFRAG, REDIS_MESH, CACHE_GLIBC, CACHE_JEMALLOC, CACHE_MESH, CACHE_HANDLES)
SMOKE_CONFIGS = (REDIS_JEMALLOC, CACHE_MESH, CACHE_HANDLES)
# Which redis-lru configuration each Redis row is.
REDIS_ROWS = {REDIS_JEMALLOC: redis_lru.BASELINE, REDIS_DEFRAG: redis_lru.ACTIVEDEFRAG,
              REDIS_MESH: redis_lru.MESHALLOC}
MESHALLOC_CONFIG = "meshalloc:3y"  # the library's defaults, as redis-lru's main meshalloc row
CONFIGS_VARIABLE = "HANDLES_CONFIGS"

REPETITIONS = {SMOKE: 1, QUICK: 1, FULL: 3}
# GETs after the insertion (lru_client --reads): the read path's cost of pinning, Alaska's read
# latency. About as many as the cache holds keys, most of them misses (evicted keys).
READS = {SMOKE: 5_000, QUICK: 500_000, FULL: 500_000}
TIMING_ROUNDS = {SMOKE: 1, QUICK: 3, FULL: 10}

# handle_ops: (repetitions inside one process, processes per allocator, its options). Batches
# of 64 allocations before their frees: within reach of every allocator's per-thread cache, so
# the pair is compared with malloc's fast path (with batches of 1024 same-size blocks meshalloc's
# malloc + free itself took 30 ns, and the handle pair looked as cheap as it).
OPS_BATCH = ["--batch", "64"]
OPS_RUNS = {SMOKE: (3, 1, ["--ops", "65536", "--objects", "4096"] + OPS_BATCH),
            QUICK: (5, 2, ["--ops", "4194304", "--objects", "262144"] + OPS_BATCH),
            FULL: (11, 3, ["--ops", "4194304", "--objects", "262144"] + OPS_BATCH)}
OPS_ALLOCATORS = ("glibc", "jemalloc", "meshalloc")
OPS_ORDER = ("malloc_free", "mh_alloc_free", "pointer_read", "pin_unpin", "pointer_random", "translate")
OPS_TIMEOUT_S = 300.0
PROBE_ARGS = ["--reps", "1", "--ops", "1024", "--objects", "16"]

# The papers' figures and issue 27's targets.
ALASKA_MEAN_RATIO = 0.60  # "reduces memory usage ... from almost 300MiB to 150MiB (40% less)"
ALASKA_LATENCY = (1.13, 1.17)  # YCSB read (A) and update (F) latency with Anchorage
MESH_MEAN_RATIO = redis_lru.PAPER_MEAN_RATIO
TARGET_MEAN_RATIO = 0.60
TARGET_THROUGHPUT_RATIO = 1.15
TARGET_ALLOC_RATIO = 1.2
TARGET_PIN_NS = 10.0
RATIO_SLACK = redis_lru.RATIO_SLACK

# The cache inserts faster than Redis, and a whole-run mean rewards a slow insertion (the cache
# fills later), so the mean after the insertion is in the main table beside it.
_COLUMNS = {column[0]: column for column in redis_lru.MAIN_COLUMNS + redis_lru.DETAIL_COLUMNS}
_COLUMNS.update({"reads_s": ("reads_s", "GETs s", 1, 3), "reads_ratio": ("reads_ratio", "GETs ×", None, 2),
                 "handles_cpu_s": ("handles_cpu_s", "moving s", 1, 3),
                 "handles_moved": ("handles_moved", "moved MiB", MIB, 1),
                 "handles_passes": ("handles_passes", "moving passes", 1, 0),
                 "handles_pause_max_ms": ("handles_pause_max_ms", "longest wait for a move ms", 1, 3)})
MAIN_COLUMNS = [_COLUMNS[key] for key in ("mean_pss", "mean_ratio", "mean_pss_after_insertion", "after_ratio",
                                          "peak_pss", "insertion_s", "insertion_ratio", "reads_s", "reads_ratio",
                                          "mesh_cpu_s", "defrag_s", "handles_cpu_s")]
DETAIL_COLUMNS = [_COLUMNS[key] for key in ("final_pss", "insertion_cpu_s", "insertion_cpu_ratio", "server_cpu_s",
                                            "sampled_insertion_s", "peak_maps", "evicted_keys", "handles_moved",
                                            "handles_passes", "handles_pause_max_ms")]
# The handle cache's INFO fields (meshalloc's handles.* statistics at the end of the hold):
# column -> (field, divisor).
HANDLE_INFO = {"handles_cpu_s": ("handles_cpu_ns", 1e9), "handles_moved": ("handles_moved_bytes", 1),
               "handles_passes": ("handles_passes", 1), "handles_pause_max_ms": ("handles_pause_max_ns", 1e6)}


def wanted_configs(context: Context) -> List[str]:
    """The rows to run: --allocators' or HANDLES_CONFIGS' names (of CONFIG_ORDER), else the
    mode's; the baseline always, first."""
    names, source = requested_specs(context, CONFIG_ORDER, SMOKE_CONFIGS, CONFIGS_VARIABLE)
    unknown = sorted(set(names) - set(CONFIG_ORDER))
    if unknown:
        raise ExperimentUnavailable(f"{source}: unknown configuration(s) {', '.join(unknown)} "
                                    f"(known: {', '.join(CONFIG_ORDER)})")
    return [BASELINE] + [name for name in CONFIG_ORDER if name in names and name != BASELINE]


def handles_available(ops: Path, allocator: Allocator) -> bool:
    """Whether this libmeshalloc.so has the handle API: handle_ops says so when preloaded with it."""
    try:
        done = subprocess.run([str(ops), *PROBE_ARGS], env=allocator.environment(os.environ), capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "handles=yes" in done.stdout


def meshalloc(context: Context) -> Optional[Allocator]:
    """meshalloc with its defaults, preloading the experiment's private copy; None when the
    library is not built."""
    try:
        return with_private_meshalloc(context, [resolve(MESHALLOC_CONFIG, context.build_dir)])[0]
    except MeshallocError:
        return None


def build_configs(context: Context, names: Sequence[str], install, server: Path, mesh: Optional[Allocator],
                  handles: bool) -> Tuple[List[Config], List[str]]:
    """The rows that can run here, and a note for each one that cannot."""
    redis_names = [REDIS_ROWS[name] for name in names if name in REDIS_ROWS]
    redis_configs, skipped = redis_lru.build_configs(context, redis_names, False, install)
    by_redis_name = {config.name: config for config in redis_configs}
    configs: List[Config] = []
    for name in names:
        if name in REDIS_ROWS:
            if REDIS_ROWS[name] in by_redis_name:
                configs.append(replace(by_redis_name[REDIS_ROWS[name]], name=name))
            continue
        storage = "handles" if name == CACHE_HANDLES else "malloc"
        arguments = ["--storage", storage]
        if name == CACHE_GLIBC:
            configs.append(Config(name, server, Allocator(name=name, library=None, description="glibc malloc"),
                                  extra_args=arguments))
        elif name == CACHE_JEMALLOC:
            try:
                configs.append(Config(name, server, resolve("jemalloc", context.build_dir), extra_args=arguments))
            except MeshallocError as error:
                skipped.append(f"{name}: {error}")
        elif mesh is None:
            skipped.append(f"{name}: libmeshalloc.so is not built (`make release`)")
        elif storage == "handles" and not handles:
            skipped.append(f"{name}: this libmeshalloc.so has no handle API (mh_alloc ...; "
                           "include/meshalloc_handle.h)")
        else:
            configs.append(Config(name, server, mesh, extra_args=arguments,
                                  meshalloc=bool(mesh.library and library_options(mesh.library))))
    return configs, skipped


# ---------------------------------------------------------------------------------------------
# The operations (handle_ops)

@dataclass
class OpsResult:
    """ns per operation, by (allocator, operation), over every repetition of every process."""
    values: Dict[Tuple[str, str], List[float]]
    problems: List[str]

    def stat(self, allocator: str, operation: str) -> Optional[Stat]:
        return Stat.of(self.values.get((allocator, operation), []))

    def paired(self, allocator: str, numerator: str, denominator: str) -> Optional[Stat]:
        """numerator / denominator per repetition of the same process (they ran back to back)."""
        ratios = [a / b for a, b in zip(self.values.get((allocator, numerator), []),
                                        self.values.get((allocator, denominator), [])) if b]
        return Stat.of(ratios)


def ops_allocators(context: Context, mesh: Optional[Allocator]) -> Tuple[List[Allocator], List[str]]:
    found: List[Allocator] = []
    skipped: List[str] = []
    for name in OPS_ALLOCATORS:
        if name == "meshalloc":
            if mesh is None:
                skipped.append("handle_ops under meshalloc: libmeshalloc.so is not built")
                continue
            found.append(replace(mesh, name=name))
        elif name == "glibc":
            found.append(Allocator(name=name, library=None, description="glibc malloc"))
        else:
            try:
                found.append(resolve(name, context.build_dir))
            except MeshallocError as error:
                skipped.append(f"handle_ops under {name}: {error}")
    return found, skipped


def ops_result(runs: Sequence[Measured]) -> OpsResult:
    """ns per operation from every handle_ops process (its `op=... ns=...` lines), in schedule order."""
    result = OpsResult({}, [])
    for run in runs:
        for operation, values in run.figures.get("ops", {}).items():
            result.values.setdefault((run.allocator.name, operation), []).extend(values)
    return result


def ops_line(result: OpsResult, allocator: str) -> str:
    parts = []
    for operation in OPS_ORDER:
        stat = result.stat(allocator, operation)
        if stat:
            parts.append(f"{operation} {stat.median:.1f} ns")
    return ", ".join(parts) or "no result"


def ns_text(stat: Optional[Stat]) -> str:
    return stat_text(stat, 2)


def ops_table(result: OpsResult, allocators: Sequence[Allocator]) -> str:
    names = [allocator.name for allocator in allocators]
    lines = ["| operation | " + " | ".join(f"{name} ns" for name in names) + " |",
             "|---|" + "---:|" * len(names)]
    for operation in OPS_ORDER:
        cells = [ns_text(result.stat(name, operation)) for name in names]
        if any(cell != "—" for cell in cells):
            lines.append(f"| {operation} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_ops_tsv(out: Path, result: OpsResult) -> Path:
    rows = []
    for (allocator, operation), values in sorted(result.values.items()):
        for index, value in enumerate(values, 1):
            rows.append([allocator, operation, str(index), number(value)])
    return write_tsv(out / "ops.tsv", ["allocator", "operation", "repetition", "ns"], rows)


# ---------------------------------------------------------------------------------------------
# Claims

def apply_reads(table: redis_lru.Table, reads: redis_lru.Rounds) -> None:
    """reads_s over every unsampled run's read phase, reads_ratio the median of per-round ratios."""
    for name, row in table.items():
        row["reads_s"] = Stat.of([times[name] for times in reads.values() if name in times])
        row["reads_ratio"] = Stat.of(redis_lru.round_ratios(reads, name, BASELINE))


def apply_handle_stats(table: redis_lru.Table, runs: Sequence[Run]) -> None:
    """The defragmenter's work in each handle-cache run (INFO's handles_* fields), per configuration."""
    for name, row in table.items():
        good = [run for run in runs if run.config.name == name and run.ok and "handles_moved" in run.info]
        for column, (field, divisor) in HANDLE_INFO.items():
            row[column] = Stat.of([float(run.info[field]) / divisor for run in good if field in run.info])


def paired_claim_text(rounds: redis_lru.Rounds, name: str, baseline: str) -> Tuple[Optional[Stat], str]:
    """name's per-round ratios to baseline, and their text."""
    paired = redis_lru.round_ratios(rounds, name, baseline)
    stat = Stat.of(paired)
    return stat, (redis_lru.ratio_text(stat, len(paired)).replace(" run", " paired round") if stat else "—")


def floor_text(table: redis_lru.Table, maxmemory_mib: Optional[float]) -> str:
    """What a cache whose PSS were exactly its `maxmemory` would score after the insertion
    against the baseline: the bound the accounting sets on the handle cache's ratio, since the
    cache holds `maxmemory` of accounted bytes from early in the load on."""
    after = table.get(BASELINE, {}).get("mean_pss_after_insertion")
    if not maxmemory_mib or not after or not after.median:
        return ""
    return (f"; a cache whose PSS were its maxmemory ({maxmemory_mib:g} MiB) would be at "
            f"{maxmemory_mib * MIB / after.median:.2f}× after the insertion")


def claims(table: redis_lru.Table, runs: Sequence[Run], rounds: redis_lru.Rounds, ops: OpsResult,
           checked: bool, reads: Optional[redis_lru.Rounds] = None,
           maxmemory_mib: Optional[float] = None) -> List[Claim]:
    """Alaska's and issue 27's statements, each with this machine's number. With checked False
    (smoke), every verdict is None."""
    count = lambda name: sum(1 for run in runs if run.config.name == name and run.ok)  # noqa: E731
    result = Claims(checked)
    add = result.add

    def mean_ratio(name: str) -> Optional[Stat]:
        return table.get(name, {}).get("mean_ratio")

    handles = mean_ratio(CACHE_HANDLES)
    after = table.get(CACHE_HANDLES, {}).get("after_ratio")
    n_handles = count(CACHE_HANDLES)
    add("handle cache mean PSS vs Redis + jemalloc",
        f"{ALASKA_MEAN_RATIO:.2f}× (Alaska: 40 % less; target ≤ {TARGET_MEAN_RATIO:.2f}×)",
        redis_lru.ratio_text(handles, n_handles), handles.median <= TARGET_MEAN_RATIO if handles else None,
        f"issue 27's target ≤ {TARGET_MEAN_RATIO:.2f}×" + (f"; after the insertion alone: {after.median:.2f}×"
                                                            if after else "") + floor_text(table, maxmemory_mib))

    defrag = mean_ratio(REDIS_DEFRAG)
    ours = (f"handles {redis_lru.ratio_text(handles, n_handles)} vs activedefrag "
            f"{redis_lru.ratio_text(defrag, count(REDIS_DEFRAG))}" if handles and defrag else "—")
    add("handles save as much as Redis's active defragmentation", "as good as activedefrag (Alaska figure 9)", ours,
        handles.median <= defrag.median + RATIO_SLACK if handles and defrag else None,
        f"holds when the handle cache's ratio is at most activedefrag's + {RATIO_SLACK:.2f}")

    for meshing in (CACHE_MESH, REDIS_MESH):
        mesh = mean_ratio(meshing)
        ours = (f"handles {redis_lru.ratio_text(handles, n_handles)} vs {meshing} "
                f"{redis_lru.ratio_text(mesh, count(meshing))}" if handles and mesh else "—")
        add(f"handle cache mean PSS below meshing's ({meshing})",
            f"issue 27's target (Mesh: {MESH_MEAN_RATIO:.2f}× jemalloc)", ours,
            handles.median < mesh.median if handles and mesh else None, "the same run, ratios to Redis + jemalloc")

    stat, ours = paired_claim_text(rounds, CACHE_HANDLES, CACHE_MESH)
    add("handle cache insertion time vs the same cache on malloc (both meshalloc)",
        f"{ALASKA_LATENCY[1]:.2f}× (Alaska: +17 % update latency in Redis; target ≤ {TARGET_THROUGHPUT_RATIO:.2f}×)",
        ours, stat.median <= TARGET_THROUGHPUT_RATIO if stat else None,
        "median of per-round ratios of unsampled insertions (timing.tsv)")
    stat, ours = paired_claim_text(reads or {}, CACHE_HANDLES, CACHE_MESH)
    add("handle cache GET time vs the same cache on malloc (both meshalloc)",
        f"{ALASKA_LATENCY[0]:.2f}× (Alaska: +13 % read latency in Redis; target ≤ {TARGET_THROUGHPUT_RATIO:.2f}×)",
        ours, stat.median <= TARGET_THROUGHPUT_RATIO if stat else None,
        "median of per-round ratios of the unsampled runs' read phases (timing.tsv's runs, reads_s)")

    alloc = ops.paired("meshalloc", "mh_alloc_free", "malloc_free")
    add("mh_alloc + mh_free vs malloc + free (meshalloc, same process)", f"target ≤ {TARGET_ALLOC_RATIO:.1f}×",
        redis_lru.ratio_text(alloc, len(ops.values.get(("meshalloc", "malloc_free"), []))),
        alloc.median <= TARGET_ALLOC_RATIO if alloc else None, "handle_ops, per repetition of one process")

    pin = ops.stat("meshalloc", "pin_unpin")
    ours = f"{ns_text(pin)} ns" if pin else "—"
    add("mh_pin + mh_unpin, uncontended", f"target < {TARGET_PIN_NS:g} ns (Alaska: a 6-instruction translation)",
        ours, pin.median < TARGET_PIN_NS if pin else None, "handle_ops pin_unpin: pin, read a byte, unpin")
    return result.found


# ---------------------------------------------------------------------------------------------
# The experiment

def caption(load, repetitions: int, rounds: int) -> str:
    return (f"{load.describe()}. Medians over {repetitions} interleaved repetition(s); × = over "
            f"{BASELINE}'s median, except insertion ×: the median (min–max) of {rounds} per-round ratios "
            "(timing.tsv). The cache evicts as Redis does (allkeys-lru sampling, used memory = usable sizes of "
            "its entries and table); cache/handles keeps every entry behind a meshalloc handle.")


def summary_details(load, configs: Sequence[Config], runs: Sequence[Run], ops: OpsResult) -> Dict[str, Any]:
    return dict(
        workload={"maxmemory": load.maxmemory, "hold_s": load.hold_s, "pipeline": load.pipeline, "reads": load.reads,
                  "phases": [{"keys": keys, "value_bytes": size} for keys, size in load.phases]},
        configs=[{"name": config.name, "server": str(config.server), "preload": str(config.allocator.library or ""),
                  "extra_args": config.extra_args} for config in configs],
        runs=[{"config": run.config.name, "repetition": run.repetition, "ok": run.ok, "problems": run.problems,
               "metrics": {metric: run.metric(metric) for metric in redis_lru.RUN_METRICS}} for run in runs],
        ops={f"{allocator} {operation}": values for (allocator, operation), values in ops.values.items()})


@dataclass(frozen=True)
class HandlesParameters(redis_lru.RedisParameters):
    ops: Tuple[int, int, Tuple[str, ...]] = (1, 1, ())  # handle_ops: repetitions, processes, options


OPS_PASS = OPS_RUN = "ops"


class Handles(redis_lru.RedisLru):
    """redis-lru's runs over the cache's rows (select), then a pass of handle_ops processes
    under its own allocators."""

    reference_config = BASELINE
    plot_title = "The Redis LRU load: Redis, and an LRU cache on malloc or on handles"

    def parameters(self, mode: str) -> HandlesParameters:
        reps, processes, options = OPS_RUNS[mode]
        return HandlesParameters(REPETITIONS[mode], load=replace(redis_lru.workload(mode), reads=READS[mode]),
                                 timing_rounds=TIMING_ROUNDS[mode], ops=(reps, processes, tuple(options)))

    def passes(self, params: HandlesParameters) -> List[Pass]:
        return list(super().passes(params)) + [Pass(OPS_PASS, params.ops[1], directory="ops", kinds=(OPS_RUN,),
                                                    allocators=lambda session: session.state["ops_allocators"])]

    def select(self, session: Session) -> Selection:
        context = session.context
        server, ops = built(context, SERVER_BINARY), built(context, OPS_BINARY)
        install, notes = redis_lru.locate_redis(context)
        client = compile_client(context.root)
        mesh = meshalloc(context)
        handles = mesh is not None and handles_available(ops, mesh)
        configs, skipped = build_configs(context, wanted_configs(context), install, server, mesh, handles)
        if not any(config.name == BASELINE for config in configs):
            raise ExperimentUnavailable("the baseline cannot run here: " + "; ".join(skipped))
        allocators, ops_skipped = ops_allocators(context, mesh)
        session.notes += notes + [f"Skipped {line}" for line in skipped] + ops_skipped
        session.state.update(install=install, client=client, ops=ops, ops_allocators=allocators)
        return Selection(list(configs), [], BASELINE)

    def command(self, session: Session, workload, config) -> Command:
        if session.current_kind != OPS_RUN:
            return super().command(session, workload, config)
        reps, _, options = session.params.ops
        return Command([str(session.state["ops"]), "--reps", str(reps), *options], measure=TIMED,
                       timeout_s=OPS_TIMEOUT_S)

    def parse(self, session: Session, run: Measured) -> Dict[str, Any]:
        if session.current_pass.name != OPS_PASS:
            return super().parse(session, run)
        found: Dict[str, List[float]] = {}  # ns per operation, one value per repetition inside the process
        for line in run.stdout.splitlines():
            fields = dict(KEY_VALUE.findall(line))
            if "op" in fields and "ns" in fields:
                found.setdefault(fields["op"], []).append(float(fields["ns"]))
        return {"ops": found}

    def progress(self, run: Measured) -> str:
        if run.pass_name != OPS_PASS:
            return super().progress(run)
        return f"{run.allocator.name}: " + ops_line(ops_result([run]), run.allocator.name)

    def extra(self, session: Session, results: Results) -> Tuple[redis_lru.Rounds, OpsResult]:
        """The read phase's rounds and the operations, with the handle columns added to the table."""
        if "extra" not in session.state:
            numbers = self.numbers(session, results)
            reads = redis_lru.insertion_rounds(numbers.runs, numbers.insertions, key="reads_s")
            apply_reads(numbers.table, reads)
            apply_handle_stats(numbers.table, numbers.runs)
            session.state["extra"] = reads, ops_result([run for run in results.runs if run.pass_name == OPS_PASS])
        return session.state["extra"]

    def claims(self, session: Session, results: Results) -> List[Claim]:
        numbers = self.numbers(session, results)
        reads, ops = self.extra(session, results)
        return claims(numbers.table, numbers.runs, numbers.rounds, ops, checked=session.checked, reads=reads,
                      maxmemory_mib=redis_lru.maxmemory_in_mib(session.params.load.maxmemory))

    def report(self, session: Session, results: Results, found: Sequence[Claim]) -> Report:
        numbers, out = self.numbers(session, results), session.out
        _, ops = self.extra(session, results)
        repetitions, configs = session.params.repetitions, results.allocators
        main = redis_lru.config_table(numbers.runs, configs, numbers.table, MAIN_COLUMNS, repetitions, BASELINE)
        text = caption(session.params.load, repetitions, len(numbers.rounds))
        detail = redis_lru.config_table(numbers.runs, configs, numbers.table, DETAIL_COLUMNS, repetitions, BASELINE)
        micro = ops_table(ops, session.state["ops_allocators"])
        files = redis_lru.write_tables(out, numbers.runs, configs, numbers.table)
        files.append(redis_lru.write_markdown(out, main, text, detail, numbers.runs, "Operations (handle_ops; median "
                                              "(min–max) ns per operation):\n\n" + micro + "\n"))
        files += [redis_lru.write_timing(out, numbers.insertions, numbers.runs, numbers.rounds, numbers.cpu_rounds,
                                         BASELINE), write_ops_tsv(out, ops)]
        return Report(main + "\n" + text + "\n\n" + micro, None, files)

    def summary_details(self, session: Session, results: Results) -> Dict[str, Any]:
        return summary_details(session.params.load, results.allocators, self.numbers(session, results).runs,
                               self.extra(session, results)[1])


EXPERIMENT = Handles(name=NAME, title="Handles: an LRU cache that moves its objects",
                     paper="Alaska §5.5, figure 9; Mesh §6.2.2", own_allocators=CONFIG_ORDER)
