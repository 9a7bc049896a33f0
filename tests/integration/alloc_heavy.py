"""Allocation-heavy, deterministic Python workload for the integration test.

Builds and tears down dicts, lists, strings, tuples, objects and JSON documents, some of them
in threads, and prints one line: counts and a SHA-256 over everything it computed. The output
must be identical with and without the allocator preloaded.
"""

import hashlib
import json
import random
import threading
import zlib


class Node:
    __slots__ = ("key", "value", "children")

    def __init__(self, key, value):
        self.key = key
        self.value = value
        self.children = []


def build_tree(rng, depth, fanout):
    root = Node("root", 0)
    frontier = [root]
    count = 1
    for level in range(depth):
        nxt = []
        for node in frontier:
            for i in range(rng.randint(1, fanout)):
                child = Node(f"{node.key}/{level}.{i}", rng.random())
                node.children.append(child)
                nxt.append(child)
                count += 1
        frontier = nxt
    return root, count


def walk(node, digest):
    stack = [node]
    total = 0
    while stack:
        n = stack.pop()
        digest.update(n.key.encode())
        total += 1
        stack.extend(n.children)
    return total


def strings_and_dicts(rng, digest, rounds):
    table = {}
    for r in range(rounds):
        for i in range(20000):
            key = "k%d_%d" % (i, rng.randrange(1000))
            table[key] = ("v" * rng.randrange(1, 200)) + str(i)
        # Drop a random half: leaves holes behind in every size class.
        for key in [k for k in table if zlib.crc32(k.encode()) % 2 == r % 2]:
            del table[key]
        parts = sorted(table.items())[:5000]
        digest.update("".join(k + v for k, v in parts).encode())
    return len(table)


def lists_and_json(rng, digest):
    docs = []
    for i in range(3000):
        doc = {
            "id": i,
            "tags": [f"t{rng.randrange(50)}" for _ in range(rng.randrange(1, 12))],
            "blob": "x" * rng.randrange(0, 3000),
            "nested": {"a": list(range(rng.randrange(30))), "b": {"c": str(i) * 3}},
        }
        docs.append(json.dumps(doc, sort_keys=True))
    parsed = [json.loads(d) for d in docs]
    digest.update(json.dumps(parsed[::7], sort_keys=True).encode())
    return sum(len(d) for d in docs)


def thread_work(seed, results, index):
    rng = random.Random(seed)
    d = hashlib.sha256()
    root, count = build_tree(rng, 5, 6)
    walked = walk(root, d)
    blocks = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) * 50
              for _ in range(2000)]
    d.update(b"".join(blocks[::3]))
    results[index] = (count, walked, d.hexdigest())


def main():
    rng = random.Random(12345)
    digest = hashlib.sha256()
    kept = strings_and_dicts(rng, digest, 6)
    json_bytes = lists_and_json(rng, digest)
    root, count = build_tree(rng, 6, 7)
    walked = walk(root, digest)
    del root

    results = [None] * 4
    threads = [threading.Thread(target=thread_work, args=(100 + i, results, i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        digest.update(repr(r).encode())

    big = []
    for i in range(200):
        big.append(bytearray(rng.randrange(1 << 16, 1 << 20)))
        big[-1][-1] = i % 256
        if len(big) > 20:
            big.pop(rng.randrange(len(big)))
    digest.update(bytes(b[-1] for b in big))

    print(f"kept={kept} json={json_bytes} tree={count}/{walked} sha256={digest.hexdigest()}")


if __name__ == "__main__":
    main()
