# The two commands of the README, plus the builds they rest on.
#   make demo   install deps, build, run the demo on embedded defaults: a short
#               summary and an HTML report (make demo U3M_DEMO_FULL=1: full tables)
#   make test   install deps, build, run every test (release, then ASan+UBSan
#               with brief fuzzing of every parser)
# Other targets: build, asan, tsan, test-tsan, bench, fuzz, format, clean.

JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20
FUZZ_RUNS ?=
U3M_DEMO_FULL ?= 0

.PHONY: all deps build asan tsan test test-release test-asan test-tsan fuzz demo bench format clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)

asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)

tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS)

test: test-release test-asan fuzz

test-release: build
	@ctest --preset release -j $(JOBS)

# Python tests exercise the release binary and torch; they are not rerun here.
test-asan: asan
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --preset asan -j $(JOBS) -LE python

test-tsan: tsan
	@ctest --preset tsan -j $(JOBS) -LE python

# make fuzz FUZZ_SECONDS=600, or FUZZ_SECONDS=0 FUZZ_RUNS=1000000 (executions per target).
fuzz: asan
	@scripts/run-fuzzers.sh build/asan $(FUZZ_SECONDS) $(FUZZ_RUNS)

demo: build
	@U3M_DEMO_FULL=$(U3M_DEMO_FULL) scripts/demo.sh build/release/apps/u3m/u3m

bench: build
	@for b in build/release/bench/bench_*; do echo "== $$b"; $$b; done

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf build
