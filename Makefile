# Quickstart targets. `make demo` and `make test` each install dependencies, build and run.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build demo test test-asan bench clean format

setup:
	./scripts/setup.sh

configure: setup
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS); fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	./scripts/demo.sh $(BUILD_DIR)

# Every test, then again under each OpenBLAS core type this project must be exact on (the CPU
# reference uses no BLAS; these runs prove that nothing depends on the kernel OpenBLAS would pick).
CORETYPES ?= Haswell Zen SkylakeX Sandybridge
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600
	for ct in $(CORETYPES); do \
	  echo "== make test: OPENBLAS_CORETYPE=$$ct"; \
	  (cd $(BUILD_DIR) && OPENBLAS_CORETYPE=$$ct ctest --output-on-failure -j $(JOBS) --timeout 600) \
	    || exit 1; \
	done

# Every test under AddressSanitizer + UndefinedBehaviorSanitizer (CPU build, separate folder).
test-asan: setup
	@if [ ! -f build-asan/build.ninja ]; then \
	  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DAFD_CUDA=OFF \
	    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer"; fi
	cmake --build build-asan -j $(JOBS)
	cd build-asan && UBSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) --timeout 600

# Benchmarks (not tests): results go to docs/perf.md by hand, with the machine and the floor.
bench: build
	./bench/afd_run_tiny.sh $(BUILD_DIR)/afd
	./bench/connector_roundtrip.sh $(BUILD_DIR)/afd
	./bench/afd_decode.sh $(BUILD_DIR)/afd
	./bench/tokenize_bench.sh $(BUILD_DIR)/afd

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD_DIR)
