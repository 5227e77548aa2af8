#!/usr/bin/env bash
# Installs every Debian package hypershard needs to build, test and run
# (python3, standard library only, is for the tests' comparison scripts;
# procps gives the tests pgrep, hostname the lock test the host name,
# iproute2 and util-linux the multi-host test its network namespaces and
# per-host hostnames).
# Idempotent and quiet: does nothing when everything is present, otherwise
# runs `apt-get update` once and installs what is missing.
# Where a CUDA toolkit with cuDNN is (nvcc and cudnn.h), it also unpacks
# the headers of cudnn-frontend (NVIDIA's header-only C++ graph API for
# cuDNN, MIT) from its PyPI wheel into /opt/cudnn-frontend, for
# hypershard-cudnn.so (CMakeLists.txt); without them the build leaves that
# module out and attention runs on the CUDA cores.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libdnnl-dev
  libyaml-dev
  zlib1g-dev
  libjansson-dev
  libcmocka-dev
  python3
  procps hostname
  iproute2 util-linux
  python3-pip
)

cudnn_frontend() {
  local want=1.32.0 dir=/opt/cudnn-frontend tmp
  [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$want" ] && return 0
  { command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]; } >/dev/null || return 0
  [ -f /usr/local/cuda/include/cudnn.h ] || [ -f /usr/include/cudnn.h ] || return 0
  tmp=$(mktemp -d)
  # the headers are the same in every wheel: take one whatever python3 is
  if python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp \
       --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$tmp" \
       "nvidia-cudnn-frontend==$want" >/dev/null 2>&1 &&
     python3 - "$tmp" "$dir" "$want" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest, want = sys.argv[1:]
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z:
    z.extractall(tmp, [n for n in z.namelist() if n.startswith("include/")])
shutil.rmtree(dest, ignore_errors=True)
os.makedirs(dest)
shutil.copytree(os.path.join(tmp, "include"), os.path.join(dest, "include"))
open(os.path.join(dest, "VERSION"), "w").write(want + "\n")
PY
  then
    echo "install-deps: cudnn-frontend $want headers in $dir"
  else
    echo "install-deps: cudnn-frontend $want could not be fetched: building without hypershard-cudnn.so"
  fi
  rm -rf "$tmp"
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cudnn_frontend
