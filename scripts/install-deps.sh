#!/usr/bin/env bash
# Installs every Debian package hypershard needs to build, test and run
# (python3, standard library only, is for the tests' comparison scripts;
# procps gives the tests pgrep, hostname the lock test the host name,
# iproute2 and util-linux the multi-host test its network namespaces and
# per-host hostnames).
# Idempotent and quiet: does nothing when everything is present, otherwise
# runs `apt-get update` once and installs what is missing.
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
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
