#!/usr/bin/env python3
"""What every physical page of a thread_scaling run holds, each page counted once.

`build/release/bench/thread_scaling --page-account FILE ...` (as root, under LD_PRELOAD of the
allocator) writes, after its reading after exit, one line per kept object
(`object ADDRESS REQUESTED USABLE`, hexadecimal address) and one per present page of the process
(`page ADDRESS FRAME NAME`, the mapping's name or `[anon]`). A meshing allocator maps one
physical page at several addresses, so pages are counted by frame. The bytes of kept objects on a
frame split into the bytes requested and the rounding to the allocator's size class; the rest
of a frame that holds part of one is free space beside a live object. Frames holding none are
told apart by where they are mapped: inside a 64 MiB granule that holds a kept object (the heap's
own pages), anonymous memory elsewhere (metadata, stacks, the benchmark's bookkeeping), or a
file. Frames of files shared with other processes are counted whole here, where PSS counts a
share. See docs/memory.md ("Issue 22's gaps, in bytes").
"""

import os
import sys
from collections import Counter

GRANULE_SHIFT = 26  # the arena's segments are multiples of 64 MiB (docs/arena.md)
MB = 1e6


class AccountError(Exception):
    pass


def read_account(path, page_size):
    objects, pages = [], {}
    try:
        with open(path) as account:
            for number, line in enumerate(account, 1):
                fields = line.split(maxsplit=3)
                try:
                    if fields[0] == "object" and len(fields) == 4:
                        objects.append((int(fields[1], 16), int(fields[2]), int(fields[3])))
                    elif fields[0] == "page" and len(fields) == 4:
                        address = int(fields[1], 16)
                        if address % page_size:
                            raise ValueError
                        pages[address] = (int(fields[2]), fields[3].strip())
                    else:
                        raise ValueError
                except (ValueError, IndexError):
                    raise AccountError(f"{path}:{number}: not an object or page line") from None
    except OSError as error:
        raise AccountError(f"{path}: {error.strerror}") from None
    if not objects or not pages:
        raise AccountError(f"{path}: no objects or no pages (not a --page-account file)")
    if all(frame == 0 for frame, _ in pages.values()):
        raise AccountError(f"{path}: every frame reads 0: run the benchmark as root")
    return objects, pages


def account(objects, pages, page_size):
    """Bytes by what their frames hold, and the free bytes beside live objects by usable size."""
    requested, usable, size_of = Counter(), Counter(), {}
    for address, asked, size in objects:
        page = address - address % page_size
        while page < address + size:
            if page not in pages:
                raise AccountError(f"page {page:x} of a kept object is not present")
            frame = pages[page][0]
            low, high = max(address, page), min(address + size, page + page_size)
            usable[frame] += high - low
            requested[frame] += max(0, min(address + asked, page + page_size) - low)
            size_of[frame] = size
            page += page_size
    granules = {address >> GRANULE_SHIFT for address, _, _ in objects}
    groups, free_by_size, seen = Counter(), Counter(), set()
    for address, (frame, name) in sorted(pages.items()):
        if frame in seen:
            continue
        seen.add(frame)
        if frame in usable:
            groups["kept objects, the bytes requested"] += requested[frame]
            groups["kept objects, rounding to the size class"] += usable[frame] - requested[frame]
            free = max(0, page_size - usable[frame])
            groups["free bytes on frames holding part of a kept object"] += free
            free_by_size[size_of[frame]] += free
        elif address >> GRANULE_SHIFT in granules:
            groups["heap frames (granules of kept objects) holding none"] += page_size
        elif name == "[anon]":
            groups["anonymous frames elsewhere (metadata, stacks, bookkeeping)"] += page_size
        else:
            groups[f"file or named: {name.rsplit('/', 1)[-1]}"] += page_size
    return groups, free_by_size


def main(argv):
    if len(argv) != 2:
        print("usage: page_account.py FILE  (written by thread_scaling --page-account)", file=sys.stderr)
        return 2
    page_size = os.sysconf("SC_PAGE_SIZE")
    try:
        objects, pages = read_account(argv[1], page_size)
        groups, free_by_size = account(objects, pages, page_size)
    except AccountError as error:
        print(f"page_account: {error}", file=sys.stderr)
        return 1
    print(f"{len(objects)} kept objects, {len(set(f for f, _ in pages.values()))} physical frames")
    for name, value in groups.most_common() + [("in all", sum(groups.values()))]:
        print(f"{value:12d} B {value / MB:9.2f} MB  {name}")
    print("free bytes beside live objects, by usable size (MB):")
    for size, value in sorted(free_by_size.items(), key=lambda item: -item[1]):
        print(f"  {size:6d} {value / MB:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
