"""scripts/page_account.py: every physical frame counted once, and what it holds."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "page_account.py"
PAGE = os.sysconf("SC_PAGE_SIZE")
HEAP = 0x7F0004000000  # a 64 MiB granule


def run(tmp_path, lines):
    account = tmp_path / "account.txt"
    account.write_text("".join(line + "\n" for line in lines))
    return subprocess.run([sys.executable, str(SCRIPT), str(account)], capture_output=True, text=True)


def figure(output, label):
    for line in output.splitlines():
        if line.strip().endswith(label):
            return int(line.split()[0])
    raise AssertionError(f"no line for {label!r} in:\n{output}")


def test_a_frame_mapped_twice_is_counted_once_and_split_by_what_it_holds(tmp_path):
    alias = HEAP + 16 * PAGE  # another virtual page showing the same frame (a meshed alias)
    completed = run(tmp_path, [
        # Two objects on one frame, seen through the page and its alias, with 16 bytes of
        # rounding each; the rest of the frame is free beside them.
        f"object {HEAP:x} 1000 1024",
        f"object {alias + 1024:x} 1008 1024",
        f"page {HEAP:x} 77 [anon]",
        f"page {alias:x} 77 [anon]",
        f"page {HEAP + PAGE:x} 78 [anon]",  # in the heap's granule, no object on it
        f"page {0x7F1000000000:x} 79 [anon]",  # anonymous, elsewhere
        f"page {0x7F2000000000:x} 80 /usr/lib/libc.so.6",
    ])
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert figure(out, "the bytes requested") == 2008
    assert figure(out, "rounding to the size class") == 40
    assert figure(out, "holding part of a kept object") == PAGE - 2048
    assert figure(out, "holding none") == PAGE
    assert figure(out, "(metadata, stacks, bookkeeping)") == PAGE
    assert figure(out, "libc.so.6") == PAGE
    assert figure(out, "in all") == 4 * PAGE  # five pages mapped, four frames


def test_bad_input_is_one_line_and_a_failure(tmp_path):
    cases = {
        "every frame reads 0": [f"object {HEAP:x} 16 16", f"page {HEAP:x} 0 [anon]"],
        "not an object or page line": ["garbage"],
        "no objects or no pages": [f"page {HEAP:x} 5 [anon]"],
        "is not present": [f"object {HEAP:x} 16 16", f"page {HEAP + PAGE:x} 5 [anon]"],
    }
    for message, lines in cases.items():
        completed = run(tmp_path, lines)
        assert completed.returncode == 1
        assert message in completed.stderr
        assert len(completed.stderr.splitlines()) == 1
    missing = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none")], capture_output=True,
                             text=True)
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1
