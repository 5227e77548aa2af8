#!/usr/bin/env bash
# Packs what tests/gpu/run.sh needs on a GPU machine that has CUDA but no
# Debian packages and no network: a Release build with the cuda backend
# (hypershard, the conformance test, the module hypershard-cuda.so and, where
# the build has it, hypershard-cudnn.so) and the shared libraries that
# machine lacks (oneDNN, libyaml, jansson, cmocka, OpenCL's loader, Open MPI
# with its plugins, help files and launcher, PMIx, hwloc, libevent), as
# .gpu-bundle/ (git-ignored), under 64 MiB. CUDA's own libraries (cudart,
# cuBLASLt, NCCL, cuDNN, NVRTC) and the C and C++ runtimes are the GPU
# machine's. Packed
# as .gpu-bundle.tar.xz, the one file to carry.
#
#   bash scripts/gpu-bundle.sh          # then carry .gpu-bundle.tar.xz to the GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-gpu}
out=.gpu-bundle
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "gpu-bundle: no nvcc here: the bundle needs the cuda backend built" >&2; exit 2; }
bash scripts/install-deps.sh >/dev/null
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHS_CUDA=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target hypershard test_device_conformance hypershard_cuda
cmake --build "$build" -j"$(nproc)" --target hypershard_cudnn 2>/dev/null ||
  echo "gpu-bundle: this build has no hypershard-cudnn.so: attention will run on the CUDA cores"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/ompi"
# the cuda backend's module is loaded from beside the executable
cp "$build/hypershard" "$build/test_device_conformance" "$build/hypershard-cuda.so" "$out/bin/"
[ ! -f "$build/hypershard-cudnn.so" ] || cp "$build/hypershard-cudnn.so" "$out/bin/"
strip "$out/bin/"* 2>/dev/null || true

# Open MPI laid out under one prefix (OPAL_PREFIX relocates Debian's /usr):
# its launcher and daemon, plugins, help texts and default parameters.
multi=$(gcc -print-multiarch)
ompi_lib=/usr/lib/$multi/openmpi/lib
mkdir -p "$out/ompi/bin" "$out/ompi/lib/$multi/openmpi" "$out/ompi/share" "$out/ompi/etc"
cp -L "$(readlink -f "$(command -v mpiexec)")" "$out/ompi/bin/mpiexec"
cp -L "$(command -v orted)" "$out/ompi/bin/orted"
cp -a "$ompi_lib" "$out/ompi/lib/$multi/openmpi/"
rm -rf "$out/ompi/lib/$multi/openmpi/lib/"{*java*,*.a,pkgconfig} 2>/dev/null || true
cp -a /usr/share/openmpi "$out/ompi/share/"
cp /etc/openmpi/openmpi-mca-params.conf "$out/ompi/etc/" 2>/dev/null || true
# Only the shared-memory and TCP transports travel (the tests run with
# btl self,vader on one host): the plugins for InfiniBand, libfabric, UCX,
# PSM, OpenSHMEM and MPI-IO would pull in their libraries for nothing.
find "$out/ompi/lib" -name 'mca_*.so' \( -name '*openib*' -o -name '*ofi*' -o -name '*ucx*' \
  -o -name '*psm*' -o -name '*_cm.so' -o -name 'mca_spml_*' -o -name 'mca_sshmem_*' \
  -o -name 'mca_scoll_*' -o -name 'mca_memheap_*' -o -name 'mca_atomic_*' -o -name 'mca_io_*' \
  -o -name 'mca_fcoll_*' -o -name 'mca_fbtl_*' -o -name 'mca_fs_*' -o -name 'mca_sharedfp_*' \) \
  -delete
rm -f "$out/ompi/lib/$multi/openmpi/lib/"{liboshmem*,libmca_common_ucx*,libmca_common_ofi*,libmca_common_verbs*,libmca_common_ompio*}
# PMIx keeps plugins of its own
pmix=$(ls -d /usr/lib/"$multi"/pmix2 2>/dev/null || true)
[ -z "$pmix" ] || cp -a "$pmix" "$out/ompi/lib/$multi/"

# Every library the binaries and plugins load, but the C/C++ runtimes, the
# driver and CUDA's: those come from the GPU machine.
keep_out='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libnccl|libcudnn|libnvrtc|libnvidia)'
objs=("$out/bin/"* "$out/ompi/bin/"*)
mapfile -t plugins < <(find "$out/ompi/lib" -name '*.so*' -type f)
objs+=("${plugins[@]}")
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $keep_out ]] && continue
  [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
done
# plugins' own libraries already sit in the Open MPI tree
strip --strip-unneeded "$out/lib/"*.so* 2>/dev/null || true

# Carried packed: tests/gpu/run.sh unpacks it beside itself.
tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
size=$(du -sm "$out" | cut -f1) packed=$(du -sm "$out.tar.xz" | cut -f1)
echo "gpu-bundle: $out is ${size} MiB ($(find "$out" -type f | wc -l) files), $out.tar.xz ${packed} MiB"
[ "$packed" -le 60 ] || { echo "gpu-bundle: over the 64 MiB a device call may carry" >&2; exit 1; }
