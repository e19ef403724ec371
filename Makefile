# rdt — front door. `make` builds build/librdt.so; `make test` runs every
# suite; `make install PREFIX=...` installs the library, header, CMake
# package and pkg-config file.

GO        ?= go
CMAKE     ?= cmake
PREFIX    ?= /usr/local
BUILD     := build
CMAKE_DIR := $(BUILD)/cmake
FUZZTIME  ?= 10s
GOFLAGS_BUILD := -buildmode=c-shared -trimpath \
	-ldflags="-extldflags=-Wl,--version-script=$(CURDIR)/capi/exports.map,-soname,librdt.so"

GO_SOURCES := $(shell find core capi transports -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.map' 2>/dev/null) go.mod go.sum include/rdt.h

.PHONY: all test go-test fake-gpu-test fake-nccl-test c-test sanitize-test consumer-test python-test soak fuzz install clean demo bench bench-ray gpu-test gpu-bench

all: $(BUILD)/librdt.so $(BUILD)/include/rdt.h

$(BUILD)/librdt.so: $(GO_SOURCES)
	@mkdir -p $(BUILD)
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./capi
	@rm -f $(BUILD)/librdt.h   # cgo's generated header is not the interface

$(BUILD)/include/rdt.h: include/rdt.h
	@mkdir -p $(BUILD)/include
	cp $< $@

# NIXL for the nixl transport's tests: the pinned nixl-cu12 wheel (about
# 70 MB; it bundles UCX, and its DRAM path needs no GPU) unpacked into
# build/nixl without its torch dependency. Where it cannot be installed the
# nixl tests skip and say why. RDT_TEST_NIXL=0 skips the install.
RDT_TEST_NIXL ?= 1
NIXL_DIR   := $(BUILD)/nixl
NIXL_LIB   := $(CURDIR)/$(NIXL_DIR)/.nixl_cu12.mesonpy.libs/libnixl_capi.so
NIXL_READY := $(if $(filter 0,$(RDT_TEST_NIXL)),,$(NIXL_DIR)/.ready)
$(NIXL_DIR)/.ready: tests/requirements-nixl.txt
	rm -rf $(NIXL_DIR)
	$(PYTHON) -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --target $(NIXL_DIR) -r tests/requirements-nixl.txt \
		|| echo "nixl wheel not installed: the nixl transport's tests will skip"
	@mkdir -p $(NIXL_DIR) && touch $@

test: go-test fake-gpu-test fake-nccl-test c-test sanitize-test consumer-test python-test soak abi-check

# librdt.so's interface against the committed baseline abi/librdt.abi
# (docs/abi.md, "Keeping the ABI stable").
.PHONY: abi-check
abi-check: $(BUILD)/librdt.so
	tools/abi-check.sh $(BUILD)/librdt.so

go-test: $(NIXL_READY)
	RDT_NIXL_LIBRARY=$${RDT_NIXL_LIBRARY:-$(NIXL_LIB)} $(GO) test -race -count=1 ./...

# The GPU tests of the CUDA loader and of cuda_ipc, on machines without a
# GPU: against the test double of the CUDA driver (tests/fakecuda), with two
# devices, then again without peer access for the tests that care. Only
# these packages get it (nixl would hand its fake device pointers to UCX);
# see docs/transports.md, "Testing GPU code without a GPU".
FAKECUDA     := $(BUILD)/fakecuda/libcuda.so.1
FAKECUDA_ENV  = env -u CUDA_VISIBLE_DEVICES RDT_CUDA_LIBRARY=$(abspath $(FAKECUDA)) RDT_FAKECUDA_DEVICES=2
FAKECUDA_PKGS := ./transports/internal/cuda/... ./transports/cuda_ipc/...

$(FAKECUDA): tests/fakecuda/fake_cuda.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -g -pthread -std=c11 -Wall -Wextra -Werror -fvisibility=hidden -o $@ $<

fake-gpu-test: $(FAKECUDA) $(BUILD)/rdtbench
	$(FAKECUDA_ENV) $(GO) test -race -count=1 $(FAKECUDA_PKGS)
	$(FAKECUDA_ENV) RDT_FAKECUDA_PEER_ACCESS=0 $(GO) test -race -count=1 -run 'TwoDevices|NumbersDevicesDifferently' $(FAKECUDA_PKGS)
	@# The demo's GPU rows (nixl kept out: it would hand UCX fake device pointers).
	RDT_NIXL_LIBRARY=/nonexistent $(FAKECUDA_ENV) $(BUILD)/rdtbench demo > $(BUILD)/fake-gpu-demo.txt
	grep -E '^(auto|cuda_ipc) +1 tensor, GPU 0 .* cuda_ipc .* verified$$' $(BUILD)/fake-gpu-demo.txt | wc -l | grep -qx 2 \
		|| { cat $(BUILD)/fake-gpu-demo.txt; echo "the demo did not move GPU memory over cuda_ipc"; exit 1; }

$(CMAKE_DIR)/CMakeCache.txt:
	$(CMAKE) -S . -B $(CMAKE_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDT_BUILD_TESTS=ON

c-test: $(CMAKE_DIR)/CMakeCache.txt
	$(CMAKE) --build $(CMAKE_DIR) -j2
	cd $(CMAKE_DIR) && ctest --output-on-failure

# The C and C++ suites again, built with AddressSanitizer and
# UndefinedBehaviorSanitizer (see docs/cpp.md, "Sanitizers", for the one
# LeakSanitizer suppression, generated for the exact allocation).
ASAN_DIR := $(BUILD)/asan
sanitize-test:
	$(CMAKE) -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DRDT_BUILD_TESTS=ON -DRDT_SANITIZE=ON >/dev/null
	$(CMAKE) --build $(ASAN_DIR) -j2
	tests/sanitizers/lsan-supp.sh $(ASAN_DIR)/librdt.so $(ASAN_DIR)/lsan.supp
	cd $(ASAN_DIR) && LSAN_OPTIONS=suppressions=$(CURDIR)/$(ASAN_DIR)/lsan.supp:print_suppressions=0 \
		UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j2

# make install into a temporary prefix, then build the examples as separate
# projects with find_package(rdt) and with pkg-config, and run them.
consumer-test: all
	tests/consumer/run.sh

# The Python package: a virtualenv with the pinned test requirements, the
# wheel built once (Go runs inside its build), installed, then pytest.
PYTHON ?= python3
VENV   := $(BUILD)/venv
WHEEL_DIR := $(BUILD)/wheel

# torch (CUDA build, about 5.4 GB) is installed too unless RDT_TEST_TORCH=0.
RDT_TEST_TORCH ?= 1
$(VENV)/.ready: tests/python/requirements.txt tests/python/requirements-torch.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r tests/python/requirements.txt
	if [ "$(RDT_TEST_TORCH)" != 0 ]; then $(VENV)/bin/pip install -q -r tests/python/requirements-torch.txt; fi
	@touch $@

python-test: $(VENV)/.ready $(BUILD)/librdt.so $(NIXL_READY) $(FAKECUDA)
	rm -rf $(WHEEL_DIR) bindings/python/build
	$(VENV)/bin/pip wheel -q --no-deps -w $(WHEEL_DIR) ./bindings/python
	$(VENV)/bin/pip install -q --no-deps --force-reinstall $(WHEEL_DIR)/rdt-*.whl
	whl=$$(ls $(CURDIR)/$(WHEEL_DIR)/rdt-*.whl) && cd tests/python && RDT_WHEEL=$$whl \
		RDT_TEST_FAKECUDA=$(abspath $(FAKECUDA)) RDT_NIXL_LIBRARY=$${RDT_NIXL_LIBRARY:-$(NIXL_LIB)} $(CURDIR)/$(VENV)/bin/python -m pytest -q -p no:cacheprovider .

# The soak test: four processes (and short-lived visitors) put and get 4 KiB
# to 16 MiB over every host transport for SECONDS (whole seconds) with every
# byte verified, then every counter, descriptor and VmRSS must be back at its
# baseline (see docs/python.md, "Soak test"). It bounds its own time;
# timeout is a backstop.
SECONDS ?= 60
soak: $(VENV)/.ready $(BUILD)/librdt.so
	PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so \
		timeout -k 10 $$(( $(SECONDS) + 600 )) $(VENV)/bin/python tests/soak/soak.py --seconds $(SECONDS)

# The nccl transport and groups, on machines without GPUs: against the test
# double of NCCL (tests/fakenccl: sockets between the ranks) on top of the
# CUDA driver double with three devices. The Go tests run once more with an
# abort that peers do not notice (as with NCCL's shared-memory transports),
# for the tests of failed transfers; then the C, C++ and Python group tests
# (the Python nccl tests need torch with a CUDA device and skip). Only these
# get the doubles. See docs/transports.md, "nccl".
FAKENCCL     := $(BUILD)/fakenccl/libnccl.so.2
FAKENCCL_ENV  = env -u CUDA_VISIBLE_DEVICES RDT_CUDA_LIBRARY=$(abspath $(FAKECUDA)) RDT_FAKECUDA_DEVICES=3 \
	RDT_NCCL_LIBRARY=$(abspath $(FAKENCCL))

# No soname: a library that later needs libnccl.so.2 (torch) must not be
# handed the double because it is loaded.
$(FAKENCCL): tests/fakenccl/fake_nccl.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -g -pthread -std=c11 -Wall -Wextra -Werror -fvisibility=hidden -o $@ $< -ldl

fake-nccl-test: $(FAKECUDA) $(FAKENCCL) $(CMAKE_DIR)/CMakeCache.txt $(VENV)/.ready $(BUILD)/librdt.so
	$(FAKENCCL_ENV) $(GO) test -race -count=1 ./transports/nccl/...
	$(FAKENCCL_ENV) RDT_FAKENCCL_ABORT=silent $(GO) test -race -count=1 -run 'Abort|Dies|Fail|Destroy' ./transports/nccl/...
	$(CMAKE) --build $(CMAKE_DIR) -j2 --target test_groups test_rdt_cpp
	cd $(CMAKE_DIR) && $(FAKENCCL_ENV) ctest --output-on-failure -R '^(test_groups|cpp[.]Groups[.].*)$$'
	cd tests/python && $(FAKENCCL_ENV) PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so \
		$(CURDIR)/$(VENV)/bin/python -m pytest -q -p no:cacheprovider test_groups.py test_gpu_nccl.py

# Short coverage-guided runs of every fuzz target; the seed corpora live in
# testdata/fuzz and also run as plain tests under `go test`.
fuzz:
	$(GO) test ./core -run '^$$' -fuzz '^FuzzDecodeRef$$' -fuzztime $(FUZZTIME)
	$(GO) test ./core -run '^$$' -fuzz '^FuzzDecodeMessage$$' -fuzztime $(FUZZTIME)
	$(GO) test ./core -run '^$$' -fuzz '^FuzzDecodeRoster$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transports/cma -run '^$$' -fuzz '^FuzzDecodeMetadata$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transports/shm -run '^$$' -fuzz '^FuzzDecodeMetadata$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transports/tcp -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transports/tcp -run '^$$' -fuzz '^FuzzDecodeMetadata$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transports/nixl -run '^$$' -fuzz '^FuzzDecodeMetadata$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transports/cuda_ipc -run '^$$' -fuzz '^FuzzDecodeMetadata$$' -fuzztime $(FUZZTIME)

install: $(CMAKE_DIR)/CMakeCache.txt
	$(CMAKE) -S . -B $(CMAKE_DIR) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	$(CMAKE) --build $(CMAKE_DIR) -j2
	$(CMAKE) --install $(CMAKE_DIR)

# The demo and the benchmark: one C program over the C ABI, with the source
# in a second process it spawns.
CC       ?= cc
BENCH_CFLAGS := -O2 -g -std=c11 -Wall -Wextra -Iinclude

$(BUILD)/rdtbench: bench/rdtbench.c include/rdt.h $(BUILD)/librdt.so
	$(CC) $(BENCH_CFLAGS) -o $@ $< -L$(BUILD) -lrdt -Wl,-rpath,'$$ORIGIN'

demo: $(BUILD)/rdtbench $(NIXL_READY)
	@RDT_NIXL_LIBRARY=$${RDT_NIXL_LIBRARY:-$(NIXL_LIB)} $(BUILD)/rdtbench demo

bench: $(BUILD)/rdtbench $(VENV)/.ready $(NIXL_READY)
	RDT_NIXL_LIBRARY=$${RDT_NIXL_LIBRARY:-$(NIXL_LIB)} PYTHON=$(VENV)/bin/python $(BUILD)/rdtbench bench bench/RESULTS.md
	$(VENV)/bin/pip install -q --no-deps --force-reinstall ./bindings/python
	$(VENV)/bin/python bench/python_bench.py $(BUILD)/rdtbench >> bench/RESULTS.md
	printf '\nrdt inside Ray, against Ray'"'"'s own transports: [RAY_RESULTS.md](RAY_RESULTS.md) (`make bench-ray`).\n' >> bench/RESULTS.md

# rdt as a Ray tensor transport against Ray's object store, gloo and NIXL
# (CPU), two actors on one host, each mode in a fresh Ray session (about 15
# minutes on two cores; see bench/RAY_RESULTS.md for the method). Ray's NIXL
# mode uses the nixl wheel in build/nixl and reports itself unavailable
# without it.
bench-ray: $(VENV)/.ready $(BUILD)/librdt.so $(NIXL_READY)
	PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so \
		$(VENV)/bin/python bench/ray_bench.py --nixl-dir $(NIXL_DIR) --out bench/RAY_RESULTS.md

# On a machine with a GPU (and CUDA driver): every GPU test, then the GPU
# benchmark. Each installs what it needs by itself: the test virtualenv
# with torch's CUDA build and CuPy (tests/python/requirements-gpu.txt), and
# NIXL; the nccl transport uses the NCCL wheel torch brings (the Python
# package finds it; Go tests get it through RDT_NCCL_LIBRARY).
# RDT_REQUIRE_GPU=1 turns "no CUDA device" skips into failures, so a machine
# without a usable GPU cannot pass. Conventions for GPU transports: Go tests
# live in their package under transports/ (picked up by ./transports/...,
# built with GPU_GO_TAGS) and skip with "no CUDA device: ..." unless
# RDT_REQUIRE_GPU=1; Python tests are marked @pytest.mark.gpu in
# tests/python (selected with -m gpu). GPU_PYTHON=/path/to/python uses an
# interpreter of your own (with pytest, torch and CuPy) instead of the venv.
ifeq ($(origin GPU_PYTHON),undefined)
GPU_PYTHON := $(CURDIR)/$(VENV)/bin/python
GPU_PY_READY := $(VENV)/.gpu-ready
endif
GPU_GO_TAGS ?=
$(VENV)/.gpu-ready: $(VENV)/.ready tests/python/requirements-gpu.txt
	$(VENV)/bin/pip install -q -r tests/python/requirements-gpu.txt
	@touch $@
# The NCCL library of GPU_PYTHON's nvidia-nccl wheel, unless RDT_NCCL_LIBRARY is set.
GPU_NCCL = $${RDT_NCCL_LIBRARY:-$$($(GPU_PYTHON) -c 'import glob, sys; f = [p for d in sys.path for g in ("nvidia/nccl/lib", "nvidia/cu*/lib") for p in glob.glob(d + "/" + g + "/libnccl.so.2")]; print(f[0] if f else "")')}
GPU_ENV = RDT_NIXL_LIBRARY=$${RDT_NIXL_LIBRARY:-$(NIXL_LIB)} RDT_NCCL_LIBRARY=$(GPU_NCCL) \
	PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so
gpu-test: all $(GPU_PY_READY) $(NIXL_READY)
	RDT_REQUIRE_GPU=1 $(GPU_ENV) $(GO) test -count=1 -tags '$(GPU_GO_TAGS)' ./transports/...
	cd tests/python && RDT_REQUIRE_GPU=1 $(GPU_ENV) $(GPU_PYTHON) -m pytest -q -p no:cacheprovider -m gpu .

gpu-bench: all $(GPU_PY_READY) $(NIXL_READY)
	$(GPU_ENV) $(GPU_PYTHON) bench/gpu_bench.py

clean:
	rm -rf $(BUILD)
