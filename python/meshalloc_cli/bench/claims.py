"""Claims: how an experiment states what the paper (or an issue) says beside what this machine
measured, and how they are tabulated and counted. The experiments' claims tables and the
summary's come from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence

from .framework import Claim
from .report import NO_VALUE, markdown_table

HOLDS_WORD = {True: "yes", False: "no", None: NO_VALUE}  # a verdict in an experiment's own table
HOLDS_MARK = {True: "✓", False: "✗", None: NO_VALUE}  # a verdict in SUMMARY.md
UNCHECKED_SMOKE = "smoke run (tiny parameters): not checked"
UNMEASURED = "not measured here (an allocator is missing or failed)"


@dataclass
class Claims:
    """The claims of one run, in the order they are added. With checked False (a smoke run,
    too small to mean anything) every verdict is None and the note says why."""

    checked: bool
    unchecked_note: str = UNCHECKED_SMOKE
    found: List[Claim] = field(default_factory=list)

    def add(self, claim: str, paper: str, ours: str, holds: Optional[bool], note: str = "") -> None:
        if not self.checked:
            holds, note = None, self.unchecked_note + (f"; {note}" if note else "")
        elif holds is None and not note:
            note = UNMEASURED
        self.found.append(Claim(claim, paper, ours, holds, note))


def claims_table(found: Sequence[Claim], paper_heading: str = "paper") -> str:
    """The claims as a Markdown table: claim, paper, ours, holds (yes/no/—), note."""
    return markdown_table(["claim", paper_heading, "ours", "holds", "note"],
                          ([claim.claim, claim.paper, claim.ours, HOLDS_WORD[claim.holds], claim.note]
                           for claim in found), left=5)


def _cell(text: Any) -> str:
    """Text that stays in one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|") or NO_VALUE


def verdict(claim: Mapping[str, Any]) -> Optional[bool]:
    """A stored claim's verdict; anything but true or false is unchecked."""
    holds = claim.get("holds")
    return holds if holds in (True, False) else None


def summary_claims_table(claims: Sequence[Mapping[str, Any]]) -> List[str]:
    """Claims as outcome.json stores them, as SUMMARY.md's table lines (✓ ✗ —, note beside)."""
    lines = ["| claim | paper | this machine | holds |", "|---|---|---|:---:|"]
    for claim in claims:
        mark = HOLDS_MARK[verdict(claim)]
        note = claim.get("note") or ""
        lines.append(f"| {_cell(claim.get('claim', ''))} | {_cell(claim.get('paper', ''))} | "
                     f"{_cell(claim.get('ours', ''))} | {_cell(f'{mark} {note}' if note else mark)} |")
    return lines


@dataclass
class Tally:
    hold: int = 0
    do_not_hold: int = 0
    unchecked: int = 0

    def add(self, verdicts: Sequence[Optional[bool]]) -> None:
        for holds in verdicts:
            if holds is True:
                self.hold += 1
            elif holds is False:
                self.do_not_hold += 1
            else:
                self.unchecked += 1

    def text(self) -> str:
        return f"{self.hold} claims hold, {self.do_not_hold} do not, {self.unchecked} unchecked"

