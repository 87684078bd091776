# A thin layer over CMakePresets.json: the README's two commands.
#   make demo   build and run the demo trainer (GPU if present, else CPU)
#   make test   build and run the test suite (GPU tests skip without a GPU), then
#               the Python module's (python/run_tests.sh: skipped without python3)
PRESET ?= ci
JOBS ?= $(shell nproc)

.PHONY: demo test python-test build configure gpu-check clean

configure:
	tools/fetch_cudnn_frontend.sh
	cmake --preset $(PRESET)

build: configure
	cmake --build --preset $(PRESET) -j $(JOBS)

demo: configure
	cmake --build --preset $(PRESET) -j $(JOBS) --target accrue_demo
	./build/$(PRESET)/examples/accrue_demo

test: build
	ctest --preset $(PRESET) -j $(JOBS)
	python/run_tests.sh

# The Python module alone: pip install . into build/python-venv, then pytest.
python-test:
	python/run_tests.sh

# The whole GPU check in one call (on an H100/H200): build, GPU tests,
# compute-sanitizer, benchmarks beside PyTorch.
gpu-check:
	tools/gpu_check.sh

clean:
	rm -rf build
