"""The one scheduler: every experiment and `meshalloc compare` run their cells (workload ×
allocator) × repetitions through here.

Runs are interleaved: for each workload, repetition 1 of every allocator, then repetition 2 of
every allocator, and so on (A B C, A B C), rather than all of A's runs first, so that slow
drifts of the machine (page cache warming, thermal throttling, a noisy neighbour) spread over
every allocator instead of penalising whichever ran last. Rotated order also shifts the
allocators by one each repetition (A B C, B C A, C A B), so that none always runs first or
always follows the same neighbour. Rotation keeps the cycle, though: B still follows A in every
repetition but the one that starts with B. Balanced order (a Williams design) changes the
neighbours too: over n repetitions of n allocators (2n when n is odd) every allocator follows
every other exactly once, so that one run's after-effects (a cache, a CPU frequency, the page
cache another allocator left) do not always fall on the same allocator: what a short timed run
needs. The 1-minute load average is recorded as each run starts, so that a table can say how
busy the machine was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, List, Optional, Sequence, TypeVar

INTERLEAVED, ROTATED, BALANCED = "interleaved", "rotated", "balanced"
ORDERS = (INTERLEAVED, ROTATED, BALANCED)
LOADAVG = Path("/proc/loadavg")

Result = TypeVar("Result")


@dataclass(frozen=True)
class Slot:
    """One run of the schedule."""

    workload: Any  # the row: a workload, a thread count, a heap size (None for a single one)
    allocator: Any  # an Allocator, or an experiment's configuration (anything with a name)
    repetition: int  # 1-based
    order: int  # 1-based position in the whole schedule


@dataclass
class Done(Generic[Result]):
    slot: Slot
    load: Optional[float]  # 1-minute load average as the run started
    result: Result


def plan(workloads: Sequence[Any], allocators: Sequence[Any], repetitions: int,
         order: str = INTERLEAVED) -> List[Slot]:
    """Every (workload, allocator) cell `repetitions` times: workloads one after the other,
    and within each, repetition by repetition, every allocator once."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r} (one of {', '.join(ORDERS)})")
    slots: List[Slot] = []
    for workload in workloads:
        for repetition in range(1, repetitions + 1):
            for index in _sequence(len(allocators), repetition - 1, order):
                slots.append(Slot(workload, allocators[index], repetition, len(slots) + 1))
    return slots


def _sequence(count: int, round_index: int, order: str) -> List[int]:
    """The allocators' indices in round `round_index` (0-based) of `order`."""
    if order == INTERLEAVED or count == 0:
        return list(range(count))
    if order == ROTATED:
        shift = round_index % count
        return [(index + shift) % count for index in range(count)]
    # Williams: 0, 1, n-1, 2, n-2, ... shifted by the row, which balances first-order neighbours
    # for an even n; for an odd n every row is followed by its reverse.
    base = [0]
    for step in range(1, count):
        base.append((step + 1) // 2 if step % 2 else count - step // 2)
    row, reverse = (round_index // 2, round_index % 2 == 1) if count % 2 else (round_index, False)
    sequence = [(index + row) % count for index in base]
    return sequence[::-1] if reverse else sequence


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as notes show them ("?" when unreadable)."""
    try:
        return " ".join(LOADAVG.read_text().split()[:3])
    except OSError:
        return "?"


def one_minute_load() -> Optional[float]:
    try:
        return float(LOADAVG.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def run(slots: Sequence[Slot], execute: Callable[[Slot], Result],
        log: Optional[Callable[[str], None]] = None,
        describe: Optional[Callable[[Done[Result]], str]] = None,
        group: Optional[Callable[[Slot], str]] = None,
        stop: Optional[Callable[[Result], bool]] = None, separator: str = " ",
        each: bool = False) -> List[Done[Result]]:
    """execute(slot) for every slot in order. With `log`, one progress line per workload and
    repetition (with `each`, per run: for runs of many seconds): group(slot) (default: the
    workload and repetition) and describe(done) of each of its runs, joined by `separator`. A
    run for which stop(result) is true (the user pressed Ctrl-C) is the last."""
    done: List[Done[Result]] = []
    line: List[str] = []
    repetitions = max((slot.repetition for slot in slots), default=0)
    for index, slot in enumerate(slots):
        finished = Done(slot, one_minute_load(), execute(slot))
        done.append(finished)
        halt = stop is not None and stop(finished.result)
        if log is not None:
            line.append(describe(finished) if describe else getattr(slot.allocator, "name", str(slot.allocator)))
            following = slots[index + 1] if index + 1 < len(slots) else None
            if (each or halt or following is None or following.workload is not slot.workload
                    or following.repetition != slot.repetition):
                head = group(slot) if group else f"{slot.workload} [{slot.repetition}/{repetitions}]"
                log(f"{head} {separator.join(line)}")
                line = []
        if halt:
            break
    return done
