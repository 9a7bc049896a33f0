# The README's two commands: `make demo` (the main job) and `make test` (every test).
# Each sets the machine up first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
PYTEST := .venv/bin/pytest
MESHALLOC := .venv/bin/meshalloc

.PHONY: all setup release debug asan tsan demo test test-unit test-sanitizers test-python \
        bench bench-quick stress format clean redis-lru fuzz fuzz-build fuzz-short fuzz-trace

all: release

setup:
	./scripts/setup.sh

release debug asan tsan:
	cmake --preset $@ >/dev/null
	cmake --build --preset $@

demo: setup release
	./scripts/demo.sh

test: setup release asan tsan
	ctest --preset release -LE stress-long
	ctest --preset asan -L unit
	ctest --preset tsan -L unit
	$(PYTEST) -q python/tests
	$(MAKE) --no-print-directory fuzz-short

# The heap fuzzer (tests/fuzz, docs/testing.md): clang, libFuzzer, ASan+UBSan, core only.
# `make fuzz` runs it long, adding what it finds to build/fuzz/corpus (tests/fuzz/corpus is the
# committed seed corpus); a crash's input lands in build/fuzz/crashes/. `make fuzz-short` is the
# fixed run `make test` ends with: 60 s from the seed corpus alone, seed 1.
FUZZER := build/fuzz/tests/fuzz/heap_fuzzer
FUZZ_TIME ?= 600
FUZZ_FLAGS := -timeout=60 -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 \
              -artifact_prefix=build/fuzz/crashes/

fuzz-build: setup
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz

fuzz: fuzz-build
	mkdir -p build/fuzz/corpus build/fuzz/crashes
	$(FUZZER) $(FUZZ_FLAGS) -max_total_time=$(FUZZ_TIME) build/fuzz/corpus tests/fuzz/corpus

fuzz-short: fuzz-build
	rm -rf build/fuzz/corpus-short && mkdir -p build/fuzz/corpus-short build/fuzz/crashes
	$(FUZZER) $(FUZZ_FLAGS) -max_total_time=60 -seed=1 build/fuzz/corpus-short tests/fuzz/corpus

# The trace decoder's fuzzer (tests/trace/decoder_fuzzer.cc, docs/trace.md): FUZZ_TIME seconds
# from the committed traces in tests/trace/corpus; new inputs go to build/fuzz/trace-corpus.
TRACE_FUZZER := build/fuzz/tests/fuzz/trace_decoder_fuzzer
fuzz-trace: fuzz-build
	mkdir -p build/fuzz/trace-corpus build/fuzz/crashes
	$(TRACE_FUZZER) $(FUZZ_FLAGS) -max_len=65536 -max_total_time=$(FUZZ_TIME) build/fuzz/trace-corpus tests/trace/corpus

# Long-running work lives behind its own targets, never in `make test`.
stress: setup release
	ctest --preset release -L stress-long

# The paper's experiments (docs/bench.md): results/<experiment>/ and results/SUMMARY.md. Redis is
# built from source once (scripts/redis/build.sh is idempotent); when that fails the other
# experiments still run and SUMMARY.md lists redis-lru as skipped. The full run takes a while,
# bench-quick a reduced version of everything in under ten minutes.
REDIS_BUILD := ./scripts/redis/build.sh || echo "make: Redis could not be built; redis-lru will be skipped" >&2

bench: setup release
	$(REDIS_BUILD)
	$(MESHALLOC) bench

bench-quick: setup release
	$(REDIS_BUILD)
	$(MESHALLOC) bench --quick

redis-lru: setup release ; $(MESHALLOC) bench redis-lru

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.c' '*.cpp')

clean:
	rm -rf build

# Installing (README "Installing"): the release build into PREFIX (DESTDIR is honoured), and the
# Debian package build/deb/meshalloc_<version>_<arch>.deb (`apt install ./build/deb/meshalloc_*.deb`).
PREFIX ?= /usr/local
.PHONY: install deb
install: release
	DESTDIR="$(DESTDIR)" cmake --install build/release --prefix "$(PREFIX)"

deb: release
	cpack --config build/release/CPackConfig.cmake -G DEB -B build/deb
