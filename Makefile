# rdt — front door. `make` builds build/librdt.so; `make test` runs every
# suite; `make install PREFIX=...` installs the library, header, CMake
# package and pkg-config file; `make help` lists the targets. Each suite
# that is more than one command is a script of its own (tests/*/run.sh,
# tools/), which the targets here only call.

GO        ?= go
CMAKE     ?= cmake
PYTHON    ?= python3
CC        ?= cc
PREFIX    ?= /usr/local
BUILD     := build
CMAKE_DIR := $(BUILD)/cmake
FUZZTIME  ?= 10s

GO_SOURCES := $(shell find core capi transports -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.map' 2>/dev/null) go.mod go.sum include/rdt.h tools/build-lib.sh

.PHONY: all help test test-under-load abi-check go-test fake-gpu-test fake-nccl-test c-test sanitize-test consumer-test python-test hosts-test soak fuzz fuzz-peers install clean wheels wheel-test vllm-test vllm-venv-background demo bench bench-peers bench-sync bench-ray bench-vllm gpu-test gpu-bench gpu-pack gpu-pack-test

all: $(BUILD)/librdt.so $(BUILD)/include/rdt.h ## Build build/librdt.so and build/include/rdt.h (the default)

help: ## List the targets
	@echo "make TARGET, where TARGET is one of:"
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  %-15s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# tools/build-lib.sh is the one build recipe; CMake and setup.py run it too.
$(BUILD)/librdt.so: $(GO_SOURCES)
	GO=$(GO) tools/build-lib.sh $@

$(BUILD)/include/rdt.h: include/rdt.h
	@mkdir -p $(BUILD)/include
	cp $< $@

# NIXL for the nixl transport's tests (tools/install-nixl.sh): where it
# cannot be installed the nixl tests skip and say why. RDT_TEST_NIXL=0
# skips the install.
RDT_TEST_NIXL ?= 1
NIXL_DIR   := $(BUILD)/nixl
NIXL_LIB   := $(CURDIR)/$(NIXL_DIR)/.nixl_cu12.mesonpy.libs/libnixl_capi.so
NIXL_READY := $(if $(filter 0,$(RDT_TEST_NIXL)),,$(NIXL_DIR)/.ready)
NIXL_ENV    = RDT_NIXL_LIBRARY=$${RDT_NIXL_LIBRARY:-$(NIXL_LIB)}
$(NIXL_DIR)/.ready: tests/requirements-nixl.txt tools/install-nixl.sh
	@echo "Downloading NIXL (the nixl-cu12 wheel of tests/requirements-nixl.txt, 241 MB installed) into" \
		"$(NIXL_DIR) for the nixl transport; RDT_TEST_NIXL=0 skips the download."
	PYTHON=$(PYTHON) tools/install-nixl.sh $(NIXL_DIR) tests/requirements-nixl.txt

# The test virtualenv (tools/venv.sh) with the pinned test requirements;
# torch (CUDA build, about 5.4 GB) is installed too unless RDT_TEST_TORCH=0.
VENV      := $(BUILD)/venv
WHEEL_DIR := $(BUILD)/wheel
RDT_TEST_TORCH ?= 1
$(VENV)/.ready: tests/python/requirements.txt tests/python/requirements-torch.txt tools/venv.sh
	PYTHON=$(PYTHON) tools/venv.sh $(VENV) tests/python/requirements.txt \
		$(if $(filter 0,$(RDT_TEST_TORCH)),,tests/python/requirements-torch.txt)
	@touch $@

# The test doubles of the CUDA driver and of NCCL (see docs/transports.md).
# libnccl has no soname: a library that later needs libnccl.so.2 (torch)
# must not be handed the double because it is loaded.
FAKECUDA := $(BUILD)/fakecuda/libcuda.so.1
FAKENCCL := $(BUILD)/fakenccl/libnccl.so.2
$(FAKECUDA): tests/fakecuda/fake_cuda.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -g -pthread -std=c11 -Wall -Wextra -Werror -fvisibility=hidden -o $@ $<
$(FAKENCCL): tests/fakenccl/fake_nccl.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -g -pthread -std=c11 -Wall -Wextra -Werror -fvisibility=hidden -o $@ $< -ldl

$(CMAKE_DIR)/CMakeCache.txt:
	$(CMAKE) -S . -B $(CMAKE_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDT_BUILD_TESTS=ON

# The demo (examples/c/demo.c) and the benchmark (bench/rdtbench.c): C
# programs over the C ABI, each with the source in a second process it
# spawns, linked against build/librdt.so beside them.
C_PROGRAM_FLAGS := -O2 -g -std=c11 -Wall -Wextra -Iinclude
DEMO_SOURCES := examples/c/demo.c examples/c/demo_cuda.c
$(BUILD)/demo: $(DEMO_SOURCES) examples/c/demo_cuda.h include/rdt.h $(BUILD)/librdt.so
	$(CC) $(C_PROGRAM_FLAGS) -o $@ $(DEMO_SOURCES) -L$(BUILD) -lrdt -ldl -Wl,-rpath,'$$ORIGIN'
$(BUILD)/rdtbench: bench/rdtbench.c include/rdt.h $(BUILD)/librdt.so
	$(CC) $(C_PROGRAM_FLAGS) -o $@ $< -L$(BUILD) -lrdt -Wl,-rpath,'$$ORIGIN'

# The manylinux wheels (x86_64, aarch64) and the sdist, into dist/: zig from
# PyPI is cgo's C compiler (docs/packaging.md).
wheels: ## Build the manylinux wheels for x86_64 and aarch64 and the sdist into dist/
	GO=$(GO) PYTHON=$(PYTHON) tools/build-wheels.sh dist

# ---- test suites ----------------------------------------------------------
test: vllm-venv-background go-test fuzz-peers fake-gpu-test fake-nccl-test c-test sanitize-test consumer-test python-test vllm-test hosts-test wheel-test gpu-pack-test soak abi-check ## Build everything and run every suite below

# The same Go, C, Python and host-bed suites with one busy process per core beside
# them (tools/under-load.sh): they must pass on a loaded machine too. CI
# runs the normal `make test`.
test-under-load: $(VENV)/.ready $(BUILD)/librdt.so $(NIXL_READY) $(FAKECUDA) $(CMAKE_DIR)/CMakeCache.txt ## make test's Go, C/C++, Python and host-bed suites with one busy process per core beside them
	tools/under-load.sh $(MAKE) go-test c-test python-test hosts-test

abi-check: $(BUILD)/librdt.so ## librdt.so's interface against the committed baseline abi/librdt.abi (docs/abi.md)
	tools/abi-check.sh $(BUILD)/librdt.so

# -vet=all: go test runs every vet check on each package (every package has
# tests) from the build it makes anyway, rather than go vet compiling all
# of them a second time.
go-test: $(NIXL_READY) ## The Go tests of every package, with the race detector and every go vet check
	$(NIXL_ENV) $(GO) test -race -vet=all -count=1 ./...

fake-gpu-test: $(FAKECUDA) $(BUILD)/demo ## cuda_ipc and the demo's GPU rows on the CUDA driver double
	GO=$(GO) FAKECUDA=$(FAKECUDA) DEMO=$(BUILD)/demo tests/fakecuda/run.sh

fake-nccl-test: $(FAKECUDA) $(FAKENCCL) $(CMAKE_DIR)/CMakeCache.txt $(VENV)/.ready $(BUILD)/librdt.so ## nccl and groups (Go, C, C++, Python) on the NCCL double
	GO=$(GO) CMAKE=$(CMAKE) FAKECUDA=$(FAKECUDA) FAKENCCL=$(FAKENCCL) CMAKE_DIR=$(CMAKE_DIR) VENV=$(VENV) \
		LIBRDT=$(BUILD)/librdt.so tests/fakenccl/run.sh

c-test: $(CMAKE_DIR)/CMakeCache.txt ## C and C++ suites through ctest (labels c and cpp: ctest -L '^c$')
	$(CMAKE) --build $(CMAKE_DIR) -j2
	cd $(CMAKE_DIR) && ctest --output-on-failure

sanitize-test: ## C and C++ suites again under AddressSanitizer and UBSan (build/asan)
	CMAKE=$(CMAKE) tests/sanitizers/run.sh $(BUILD)/asan

consumer-test: all ## Install into a temporary prefix; build and run the examples against it
	tests/consumer/run.sh

python-test: $(VENV)/.ready $(BUILD)/librdt.so $(NIXL_READY) $(FAKECUDA) ## Build the wheel, install it, run pytest over tests/python
	$(NIXL_ENV) VENV=$(VENV) WHEEL_DIR=$(WHEEL_DIR) FAKECUDA=$(FAKECUDA) tests/python/run.sh

# vLLM's CPU build in a virtualenv of its own (tools/vllm-venv.sh, pinned by
# tests/vllm/requirements.txt, about 6 GB): the "librdt" weight-transfer
# backend against a real vLLM (docs/vllm.md), from a wheel of this tree.
VLLM_VENV := $(BUILD)/vllm-venv
$(VLLM_VENV)/.ready: tests/vllm/requirements.txt tools/vllm-venv.sh
	PYTHON=$(PYTHON) tools/vllm-venv.sh $(VLLM_VENV) tests/vllm/requirements.txt

# make test starts that install first, in the background, and vllm-test
# waits for it: its download and unpacking overlap the suites before.
vllm-venv-background:
	@PYTHON=$(PYTHON) tools/vllm-venv.sh --background $(VLLM_VENV) tests/vllm/requirements.txt

vllm-test: $(VLLM_VENV)/.ready $(BUILD)/librdt.so ## rdt as vLLM's weight-transfer backend: the engines' contract and a real vLLM (CPU build) synced end to end
	VLLM_VENV=$(VLLM_VENV) tests/vllm/run.sh

# Several hosts as network, mount and pid namespaces on this machine
# (tests/hosts/bed.py): faults between hosts over real links. Needs root;
# elsewhere every test skips and says why. Runs the tree's binding and
# library, not the installed wheel.
hosts-test: $(VENV)/.ready $(BUILD)/librdt.so $(NIXL_READY) ## The multi-host test bed (root): cut, slowed and healed links between runtimes on separate network stacks
	$(NIXL_ENV) PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so \
		$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/hosts

wheel-test: wheels ## auditwheel on both wheels; each installed without Go and smoke-tested (aarch64 under qemu-user)
	GO=$(GO) PYTHON=$(PYTHON) tests/wheels/run.sh dist

# The soak test bounds its own time (docs/python.md, "Soak test"); timeout
# is a backstop.
SECONDS ?= 60
soak: $(VENV)/.ready $(BUILD)/librdt.so ## SECONDS (60) of four processes over every host transport, then leak checks
	PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so \
		timeout -k 10 $$(( $(SECONDS) + 600 )) $(VENV)/bin/python tests/soak/soak.py --seconds $(SECONDS)

fuzz: ## FUZZTIME (10s) of coverage-guided fuzzing for every fuzz target go test finds
	GO=$(GO) tools/fuzz.sh $(FUZZTIME)

# The fuzz targets of the checks a peer's numbers reach (the ranges of
# writes and partial fetches, tcp runs, write frames and requests, control
# messages, refs, views made from refs), FUZZ_PEERS_TIME each, in make test: about 40 s on two
# cores with a warm build cache, 90 s when the fuzzing build of the
# standard library is not cached yet. A count of executions, not a
# duration: Go 1.26's fuzzing coordinator can fail a target with "context
# deadline exceeded" when a -fuzztime duration ends on a loaded machine
# (go.dev/issue/75804, fixed in Go 1.27); a count has no deadline to race.
FUZZ_PEERS      := FuzzPieceContains FuzzCovered FuzzCheckPieces FuzzCheckSource FuzzCheckAdmittedPieces \
	FuzzCheckWrite FuzzDecodeRequest FuzzCheckWritePieces FuzzDecodeWriteRequest FuzzDecodeWriteReplies \
	FuzzDecodeMessage FuzzDecodeRef FuzzViewOfRef
FUZZ_PEERS_TIME ?= 10000x
fuzz-peers: ## FUZZ_PEERS_TIME (10000x: executions) of fuzzing for each target that checks a peer's numbers (part of make test)
	GO=$(GO) tools/fuzz.sh $(FUZZ_PEERS_TIME) $(FUZZ_PEERS)

# ---- demo, benchmarks, install ---------------------------------------------
demo: $(BUILD)/demo $(NIXL_READY) ## Move tensors from a second process over every transport; fails if one did not
	@$(NIXL_ENV) $(BUILD)/demo

# bench/run.sh: the C benchmark, then the Python binding against the C ABI.
bench: $(BUILD)/rdtbench $(VENV)/.ready $(NIXL_READY) ## Measure the transports against this machine's limits into bench/RESULTS.md
	$(NIXL_ENV) bench/run.sh $(BUILD)/rdtbench $(VENV) bench/RESULTS.md

# rdt against the libraries users would pick instead (bench/peers.py),
# each in a process pair of its own, in one run with rdt's own rows (about
# 10 minutes on two cores). The target installs the peers itself: Mooncake
# and numpy, pinned, into their own virtualenv BENCH_VENV; Debian's
# libibverbs1, which Mooncake's engine.so links, unpacked under BENCH_LIBS
# (nothing system-wide); NIXL is build/nixl, torch (gloo) the test
# virtualenv's. A peer that cannot be installed or run gets a row saying why.
BENCH_VENV := $(BUILD)/bench-venv
BENCH_LIBS := $(BUILD)/bench-libs
$(BENCH_VENV)/.ready: bench/requirements-peers.txt tools/venv.sh
	PYTHON=$(PYTHON) tools/venv.sh $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q -r bench/requirements-peers.txt || \
		echo "bench-peers: the pinned peers did not install; their rows will say why" >&2
	@touch $@
$(BENCH_LIBS)/.ready: tools/bench-peers-libs.sh
	tools/bench-peers-libs.sh $(BENCH_LIBS)

bench-peers: $(BUILD)/rdtbench $(VENV)/.ready $(NIXL_READY) $(BENCH_VENV)/.ready $(BENCH_LIBS)/.ready ## rdt against Mooncake, NIXL, gloo, shared memory and pickle, into bench/PEERS.md
	$(NIXL_ENV) $(BENCH_VENV)/bin/python bench/peers.py --rdtbench $(BUILD)/rdtbench \
		--torch-python $(VENV)/bin/python --nixl-dir $(NIXL_DIR) --mooncake-libs $(BENCH_LIBS) \
		--out bench/PEERS.md

# Two actors on one host, each mode in a fresh Ray session (about 15
# minutes on two cores; see bench/RAY_RESULTS.md for the method). Ray's NIXL
# mode uses the nixl wheel in build/nixl and reports itself unavailable
# without it.
# The weight-sync job on four hosts of the test bed (tests/hosts/bed.py,
# root), rdt against Ray's object store and gloo, and one host's fan-out
# (about 20 minutes on two cores); bench/SYNC.md, and bench/sync.png drawn
# by matplotlib from its own pinned virtualenv.
PLOT_VENV := $(BUILD)/plot-venv
$(PLOT_VENV)/.ready: bench/requirements-plot.txt tools/venv.sh
	PYTHON=$(PYTHON) tools/venv.sh $(PLOT_VENV) bench/requirements-plot.txt
	@touch $@

bench-sync: $(VENV)/.ready $(BUILD)/librdt.so $(PLOT_VENV)/.ready ## Weight sync across four bed hosts (root): rdt against Ray's object store and gloo, into bench/SYNC.md and bench/sync.png
	PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so \
		$(VENV)/bin/python bench/sync_bench.py --out bench/SYNC.md --json $(BUILD)/sync.json
	$(PLOT_VENV)/bin/python bench/sync_plot.py $(BUILD)/sync.json bench/sync.png

bench-vllm: $(VLLM_VENV)/.ready $(BUILD)/librdt.so $(PLOT_VENV)/.ready ## Weight sync into vLLM's CPU build: librdt against vLLM's RPC and a /dev/shm checkpoint, into bench/VLLM.md and bench/vllm.png
	tools/vllm-rdt.sh $(VLLM_VENV)
	$(VLLM_VENV)/bin/python bench/vllm_bench.py --out $(BUILD)/bench-vllm.json
	$(PLOT_VENV)/bin/python bench/vllm_report.py $(BUILD)/bench-vllm.json bench/VLLM.md bench/vllm.png

bench-ray: $(VENV)/.ready $(BUILD)/librdt.so $(NIXL_READY) ## rdt as a Ray tensor transport against Ray's own, into bench/RAY_RESULTS.md
	PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so \
		$(VENV)/bin/python bench/ray_bench.py --nixl-dir $(NIXL_DIR) --out bench/RAY_RESULTS.md

# On a machine with a GPU (and CUDA driver): every GPU test, then the GPU
# benchmark. Each installs what it needs by itself: the test virtualenv
# with torch's CUDA build and CuPy (tests/python/requirements-gpu.txt), and
# NIXL; the nccl transport uses the NCCL wheel torch brings (the Python
# package finds it; Go tests get it through RDT_NCCL_LIBRARY, from
# tools/nccl-library.py). RDT_REQUIRE_GPU=1 turns "no CUDA device" skips
# into failures, so a machine without a usable GPU cannot pass. Conventions
# for GPU transports: Go tests live in their package under transports/
# (picked up by ./transports/..., built with GPU_GO_TAGS) and skip with "no
# CUDA device: ..." unless RDT_REQUIRE_GPU=1; Python tests are marked
# @pytest.mark.gpu in tests/python (selected with -m gpu).
# GPU_PYTHON=/path/to/python uses an interpreter of your own (with pytest,
# torch and CuPy) instead of the venv.
ifeq ($(origin GPU_PYTHON),undefined)
GPU_PYTHON := $(CURDIR)/$(VENV)/bin/python
GPU_PY_READY := $(VENV)/.gpu-ready
endif
GPU_GO_TAGS ?=
$(VENV)/.gpu-ready: $(VENV)/.ready tests/python/requirements-gpu.txt
	tools/venv.sh $(VENV) tests/python/requirements-gpu.txt
	@touch $@
GPU_NCCL = $${RDT_NCCL_LIBRARY:-$$($(GPU_PYTHON) $(CURDIR)/tools/nccl-library.py)}
GPU_ENV = $(NIXL_ENV) RDT_NCCL_LIBRARY=$(GPU_NCCL) \
	PYTHONPATH=$(CURDIR)/bindings/python RDT_LIBRARY=$(CURDIR)/$(BUILD)/librdt.so
gpu-test: all $(GPU_PY_READY) $(NIXL_READY) ## Every GPU test, on a machine with a GPU (no-GPU skips fail)
	RDT_REQUIRE_GPU=1 $(GPU_ENV) $(GO) test -count=1 -tags '$(GPU_GO_TAGS)' ./transports/...
	cd tests/python && RDT_REQUIRE_GPU=1 $(GPU_ENV) $(GPU_PYTHON) -m pytest -q -p no:cacheprovider -m gpu .

gpu-bench: all $(GPU_PY_READY) $(NIXL_READY) ## cuda_ipc and nixl against a device copy, on a machine with a GPU
	$(GPU_ENV) $(GPU_PYTHON) bench/gpu_bench.py

# The GPU checks for a GPU machine without network access or Go (docs/gpu.md):
# `make gpu-pack` builds build/gpu-pack here, that machine runs
# build/gpu-pack/run.sh OUT. gpu-pack-test runs the pack here, on the CUDA
# and NCCL doubles and without CUDA, and checks what it reports.
GPU_PACK := $(BUILD)/gpu-pack
gpu-pack: ## Build build/gpu-pack: every GPU check, for a GPU machine without network or Go (docs/gpu.md)
	GO=$(GO) PYTHON=$(PYTHON) GPU_GO_TAGS='$(GPU_GO_TAGS)' tools/gpu-pack.sh $(GPU_PACK)

gpu-pack-test: gpu-pack $(FAKECUDA) $(FAKENCCL) $(VENV)/.ready ## The pack's run.sh on the CUDA and NCCL doubles and without CUDA; checks its summary
	FAKECUDA=$(FAKECUDA) FAKENCCL=$(FAKENCCL) GPU_PYTHON=$(CURDIR)/$(VENV)/bin/python \
		tests/gpu-pack/run.sh $(GPU_PACK) $(BUILD)/gpu-pack-test

# A build directory of its own, without the C and C++ tests: install builds
# only what it installs.
INSTALL_DIR := $(BUILD)/cmake-install
install: ## Install library, headers, CMake package and rdt.pc into PREFIX
	$(CMAKE) -S . -B $(INSTALL_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDT_BUILD_TESTS=OFF \
		-DCMAKE_INSTALL_PREFIX=$(PREFIX)
	$(CMAKE) --build $(INSTALL_DIR) -j2
	$(CMAKE) --install $(INSTALL_DIR)

clean: ## Remove build/
	rm -rf $(BUILD)
