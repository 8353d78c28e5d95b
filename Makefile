# Quickstart targets. `make demo` and `make test` each install dependencies, build and run.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build demo test test-asan test-tsan fuzz fuzz-build fuzz-ci bench clean format

setup:
	./scripts/setup.sh

configure: setup
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS); fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	./scripts/demo.sh $(BUILD_DIR)

# The exactness tests again under each OpenBLAS core type this project must be exact on (the
# CPU reference uses no BLAS; these runs prove that nothing depends on the kernel OpenBLAS would
# pick), then every test.
CORETYPES ?= Haswell Zen SkylakeX Sandybridge
EXACTNESS_TESTS ?= Linear|Gemm|Ops|BatchInvariance|Golden|Generator|ContinuousBatching|CpuExactness|MatchesTheMonolithicModel|backend_ops
test: build
	for ct in $(CORETYPES); do \
	  echo "== make test: OPENBLAS_CORETYPE=$$ct (exactness tests)"; \
	  (cd $(BUILD_DIR) && OPENBLAS_CORETYPE=$$ct ctest --output-on-failure -j $(JOBS) \
	    --timeout 600 -R '$(EXACTNESS_TESTS)') || exit 1; \
	done
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Every test under AddressSanitizer + UndefinedBehaviorSanitizer (CPU build, separate folder).
test-asan: setup
	@if [ ! -f build-asan/build.ninja ]; then \
	  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DAFD_CUDA=OFF \
	    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer"; fi
	cmake --build build-asan -j $(JOBS)
	cd build-asan && UBSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) --timeout 600

# Every test under ThreadSanitizer (CPU build, separate folder). The multi-process tests run the
# TSan-built afd binary too. One OpenMP thread: libgomp is not built with TSan, so its barriers
# look like races between a parallel region's workers and the thread that started it.
test-tsan: setup
	@if [ ! -f build-tsan/build.ninja ]; then \
	  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DAFD_CUDA=OFF \
	    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer -O1"; fi
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 900

# libFuzzer targets (fuzz/, clang with ASan + UBSan, separate folder), FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
FUZZ_CXX ?= clang++-14
fuzz-build: setup
	@if [ ! -f build-fuzz/build.ninja ]; then \
	  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAFD_CUDA=OFF \
	    -DAFD_BUILD_TESTS=OFF -DAFD_FUZZ=ON -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) \
	    -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"; fi
	cmake --build build-fuzz -j $(JOBS) --target afd_config_fuzz model_config_fuzz \
	  safetensors_fuzz safetensors_index_fuzz wire_headers_fuzz store_protocol_fuzz \
	  engine_message_fuzz

fuzz: fuzz-build
	./fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

# What CI runs: every target for 30 s (7 targets: about 4 minutes plus the build).
fuzz-ci:
	$(MAKE) fuzz FUZZ_SECONDS=30

# Benchmarks (not tests): results go to docs/perf-log/ (and docs/perf.md's table) by hand, with the
# machine and the floor.
bench: build
	./bench/afd_run_tiny.sh $(BUILD_DIR)/afd
	./bench/connector_roundtrip.sh $(BUILD_DIR)/afd
	./bench/afd_decode.sh $(BUILD_DIR)/afd
	./bench/tokenize_bench.sh $(BUILD_DIR)/afd
	./bench/serve_cpu.sh $(BUILD_DIR)/afd
	./bench/serve_front_end.sh $(BUILD_DIR)/afd
	$(BUILD_DIR)/engine_step_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD_DIR)
