"""An allocation-heavy Python program for `meshalloc bench speed` and `real-apps`.

Usage: python3 alloc_heavy.py SCALE       (SCALE 1 takes about 0.1 s; the work is linear in it)

What a long-running Python service does to its allocator, in four phases: a cache of records
that is filled and then thinned out at random (survivors scattered over every size class),
JSON documents encoded and parsed (many short-lived strings, dicts and lists of every size),
lists and byte buffers that grow by appending (realloc growth, up to megabytes) and worker
threads building strings at the same time. Objects above 512 bytes bypass CPython's own
small-object allocator and come straight from malloc, so the phases favour sizes on both sides
of that line. Deterministic: prints one line with counts and a digest, identical under every
allocator.
"""

import hashlib
import json
import random
import sys
import threading

RECORDS_PER_SCALE = 3000
DOCUMENTS_PER_SCALE = 1000
BUFFERS_PER_SCALE = 30
THREADS = 2
THREAD_STRINGS_PER_SCALE = 20000


def fill_and_thin_cache(rng, scale, digest):
    """A dict cache filled in rounds; each round evicts a random half of what is there."""
    cache = {}
    for round_number in range(4):
        for i in range(RECORDS_PER_SCALE * scale):
            key = f"user:{round_number}:{i}:{rng.randrange(1 << 20)}"
            # Values straddle pymalloc's 512-byte limit: about a third go to malloc.
            cache[key] = {"name": "n" * rng.randrange(1, 900), "visits": [i] * rng.randrange(8)}
        for key in [key for key in cache if rng.random() < 0.5]:
            del cache[key]
    for key in sorted(cache)[:: max(1, len(cache) // 500)]:
        digest.update(key.encode())
        digest.update(cache[key]["name"][:16].encode())
    return len(cache)


def json_round_trips(rng, scale, digest):
    total = 0
    for i in range(DOCUMENTS_PER_SCALE * scale):
        document = {
            "id": i,
            "tags": [f"tag{rng.randrange(100)}" for _ in range(rng.randrange(1, 30))],
            "body": "lorem ipsum " * rng.randrange(1, 200),
            "children": [{"k": j, "v": str(j) * rng.randrange(1, 40)} for j in range(rng.randrange(20))],
        }
        text = json.dumps(document, sort_keys=True)
        parsed = json.loads(text)
        total += len(text) + len(parsed["children"])
        if i % 97 == 0:
            digest.update(text.encode())
    return total


def growing_buffers(rng, scale, digest):
    """Lists and bytearrays grown piece by piece: the interpreter reallocs them as they grow."""
    grown = 0
    for _ in range(BUFFERS_PER_SCALE * scale):
        buffer = bytearray()
        items = []
        target = rng.randrange(1 << 14, 1 << 21)
        while len(buffer) < target:
            piece = bytes([rng.randrange(256)]) * rng.randrange(16, 4096)
            buffer += piece
            items.append(len(piece))
        digest.update(buffer[-32:])
        grown += len(buffer) + len(items)
    return grown


def thread_strings(seed, scale, results, index):
    rng = random.Random(seed)
    parts = []
    for i in range(THREAD_STRINGS_PER_SCALE * scale):
        parts.append(("%d-" % i) * rng.randrange(1, 60))
        if len(parts) > 500:
            joined = "|".join(parts)
            parts = [joined[-100:]]
    results[index] = hashlib.sha256("".join(parts).encode()).hexdigest()


def main():
    scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    rng = random.Random(2019)
    digest = hashlib.sha256()
    results = [None] * THREADS
    workers = [threading.Thread(target=thread_strings, args=(7 + i, scale, results, i)) for i in range(THREADS)]
    for worker in workers:
        worker.start()
    kept = fill_and_thin_cache(rng, scale, digest)
    json_bytes = json_round_trips(rng, scale, digest)
    grown = growing_buffers(rng, scale, digest)
    for worker in workers:
        worker.join()
    for result in results:
        digest.update(result.encode())
    print(f"kept={kept} json={json_bytes} grown={grown} sha256={digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
