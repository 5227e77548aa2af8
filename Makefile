# Thin wrapper over CMake/ctest. `make demo` and `make test` install the
# Debian dependencies first, so on a fresh machine they are the whole set-up.

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
NP         ?= 2

# MPI settings travel in the environment (portable across MPI
# implementations): allow root, allow more ranks than cores, shared-memory
# transport (pml ob1 over the self and vader BTLs, named so that no rank
# probes the network transports), no core binding. Ranks get one BLAS
# thread each by default.
export OMPI_ALLOW_RUN_AS_ROOT = 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = 1
export OMPI_MCA_rmaps_base_oversubscribe = 1
export OMPI_MCA_pml = ob1
export OMPI_MCA_btl = self,vader
export OMPI_MCA_hwloc_base_binding_policy = none

.PHONY: deps build test test-asan demo bench clean

deps:
	@bash scripts/install-deps.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DHS_SANITIZE=ON -DHS_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

demo: deps build
	mpiexec -n $(NP) $(BUILD)/hypershard train fsdp_config.dp_shard_size=$(NP)

bench: deps build
	mpiexec -n 2 $(BUILD)/hypershard bench comm
	mpiexec -n 4 $(BUILD)/hypershard bench comm
	$(BUILD)/hypershard bench step --quick
	mpiexec -n 2 $(BUILD)/hypershard bench fsdp
	mpiexec -n 4 $(BUILD)/hypershard bench fsdp
	mpiexec -n 4 $(BUILD)/hypershard bench tp
	mpiexec -n 4 $(BUILD)/hypershard bench cp

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
