#!/usr/bin/env bash
# Installs the Debian packages shardlm builds against (idempotent; uses sudo when not root).
set -euo pipefail
pkgs=(build-essential cmake pkg-config git python3
      libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libboost-program-options-dev
      libgtest-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libfabric-dev
      python3-h5py python3-matplotlib)  # shardlm report --plots, and the tests that read results with h5py
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  # Not Debian or Ubuntu (an Amazon Linux or RHEL head node): say what the build needs and let
  # CMake name whatever is still missing.
  echo "[setup] no apt here: install the equivalents of ${pkgs[*]} (CMake 3.25 or newer) yourself" >&2
  exit 0
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "[setup] installing: ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
