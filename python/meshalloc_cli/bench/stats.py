"""The numbers every table is made of: medians with their min–max, ratios of medians, paired
(repetition r against repetition r) ratios and geometric means with the spread of the
per-repetition geomeans. One definition each, for every experiment and `meshalloc compare`."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple


@dataclass
class Stat:
    """Median and range of one quantity over a cell's successful runs."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[Optional[float]]) -> Optional["Stat"]:
        present = [value for value in values if value is not None]
        if not present:
            return None
        return cls(statistics.median(present), min(present), max(present))

    def scaled(self, divisor: float) -> "Stat":
        """Every figure over `divisor`: a ratio to another cell's median keeps its spread."""
        return Stat(self.median / divisor, self.low / divisor, self.high / divisor)


def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    """Geometric mean of the positive values; None when there is none."""
    present = [value for value in values if value is not None and value > 0]
    if not present:
        return None
    return math.exp(sum(math.log(value) for value in present) / len(present))


def ratio(mine: Optional[Stat], theirs: Optional[Stat]) -> Optional[float]:
    """Median over median; None when either is missing or the reference is not positive."""
    if mine is None or theirs is None or theirs.median <= 0:
        return None
    return mine.median / theirs.median


def paired_ratios(mine: Mapping[int, float], theirs: Mapping[int, float]) -> Dict[int, float]:
    """Repetition r of one allocator over repetition r of another: the two ran seconds apart,
    so a slow phase of the machine hits both. Only repetitions both have (and non-zero)."""
    return {repetition: value / theirs[repetition] for repetition, value in mine.items() if theirs.get(repetition)}


@dataclass
class Geomean:
    """A geometric mean of per-row ratios, with the lowest and highest geomean of the
    per-repetition ratios (where every row has them)."""

    value: Optional[float]
    low: Optional[float] = None
    high: Optional[float] = None
    rows: int = 0


def geomean_of(rows: Sequence[Tuple[Optional[float], Mapping[int, float]]]) -> Geomean:
    """rows: (the row's ratio of medians, its paired ratios by repetition). The value is the
    geomean of the ratios present; low/high are the extremes over repetitions r of the geomean
    of every row's ratio r, given only when every row has a ratio and at least two
    repetitions are common to all."""
    ratios = [value for value, _ in rows if value is not None]
    result = Geomean(geomean(ratios), rows=len(ratios))
    if not rows or len(ratios) != len(rows):
        return result
    paired = [by_repetition for _, by_repetition in rows]
    common = set.intersection(*(set(by_repetition) for by_repetition in paired))
    per_repetition: List[float] = [value for value in (geomean(by_repetition[repetition] for by_repetition in paired)
                                                       for repetition in sorted(common)) if value is not None]
    if len(per_repetition) > 1:
        result.low, result.high = min(per_repetition), max(per_repetition)
    return result
