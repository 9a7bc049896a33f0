"""The one scheduler (bench/schedule.py): the order runs happen in, that every cell runs its
repetitions, the progress lines and the stop on Ctrl-C."""

from __future__ import annotations

from collections import Counter

import pytest

from meshalloc_cli.bench import schedule

ALLOCATORS = ("a", "b", "c")


def _order(slots):
    return [(slot.workload, slot.allocator, slot.repetition) for slot in slots]


def test_interleaved_runs_every_allocator_once_per_repetition_in_the_same_order():
    slots = schedule.plan(["w"], ALLOCATORS, 2)
    assert _order(slots) == [("w", "a", 1), ("w", "b", 1), ("w", "c", 1), ("w", "a", 2), ("w", "b", 2), ("w", "c", 2)]
    assert [slot.order for slot in slots] == list(range(1, 7))


def test_rotated_shifts_the_allocators_by_one_each_repetition():
    slots = schedule.plan(["w"], ALLOCATORS, 4, schedule.ROTATED)
    rounds = [[slot.allocator for slot in slots if slot.repetition == repetition] for repetition in range(1, 5)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_balanced_makes_every_allocator_follow_every_other_equally_often(count):
    """Rotation keeps the cycle (b follows a in every round but one); the balanced order over n
    rounds (2n for an odd n) has every ordered pair of neighbours equally often."""
    allocators = [f"a{index}" for index in range(count)]
    rounds = count if count % 2 == 0 else 2 * count
    slots = schedule.plan(["w"], allocators, rounds, schedule.BALANCED)
    pairs = Counter((before.allocator, after.allocator) for before, after in zip(slots, slots[1:])
                    if before.repetition == after.repetition)
    assert set(pairs) == {(x, y) for x in allocators for y in allocators if x != y}
    assert len(set(pairs.values())) == 1
    for repetition in range(1, rounds + 1):
        assert sorted(slot.allocator for slot in slots if slot.repetition == repetition) == allocators


@pytest.mark.parametrize("order", schedule.ORDERS)
def test_every_cell_runs_the_given_repetitions_workload_after_workload(order):
    slots = schedule.plan(["w1", "w2"], ALLOCATORS, 3, order)
    assert Counter((slot.workload, slot.allocator) for slot in slots) == {
        (workload, allocator): 3 for workload in ("w1", "w2") for allocator in ALLOCATORS}
    assert [slot.workload for slot in slots] == ["w1"] * 9 + ["w2"] * 9
    for workload in ("w1", "w2"):
        repetitions = [slot.repetition for slot in slots if slot.workload == workload]
        assert repetitions == sorted(repetitions)


def test_unknown_order_is_refused():
    with pytest.raises(ValueError):
        schedule.plan(["w"], ALLOCATORS, 1, "grouped")


def test_run_executes_in_order_records_the_load_and_logs_a_line_per_repetition(monkeypatch):
    monkeypatch.setattr(schedule, "one_minute_load", lambda: 1.5)
    seen, lines = [], []
    done = schedule.run(schedule.plan(["w"], ALLOCATORS, 2), lambda slot: seen.append(slot) or slot.order * 10,
                        log=lines.append, describe=lambda finished: f"{finished.slot.allocator}={finished.result}")
    assert [finished.result for finished in done] == [10, 20, 30, 40, 50, 60]
    assert [finished.load for finished in done] == [1.5] * 6
    assert lines == ["w [1/2] a=10 b=20 c=30", "w [2/2] a=40 b=50 c=60"]


def test_run_logs_a_line_per_run_when_asked():
    lines = []
    schedule.run(schedule.plan(["w"], ALLOCATORS, 1), lambda slot: slot.order, log=lines.append, each=True,
                 describe=lambda finished: f"{finished.slot.allocator}={finished.result}")
    assert lines == ["w [1/1] a=1", "w [1/1] b=2", "w [1/1] c=3"]


def test_run_stops_after_the_run_that_asks_for_it():
    done = schedule.run(schedule.plan(["w"], ALLOCATORS, 2), lambda slot: slot.order, stop=lambda result: result == 2)
    assert [finished.result for finished in done] == [1, 2]
