# The README's two commands: `make demo` (the main job) and `make test` (every test).
# Each sets the machine up first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
PYTEST := .venv/bin/pytest

.PHONY: all setup release debug asan tsan demo test test-unit test-sanitizers test-python \
        bench stress format clean redis-lru

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

# Long-running work lives behind its own targets, never in `make test`.
stress: setup release
	ctest --preset release -L stress-long

bench: setup release
	./bench/run.sh
redis-lru: setup release ; ./scripts/redis/build.sh && ./bench/redis/run.sh

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.c' '*.cpp')

clean:
	rm -rf build
