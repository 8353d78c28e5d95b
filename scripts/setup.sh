#!/usr/bin/env bash
# Installs the Debian packages the build and tests need. Idempotent: packages that are
# already installed are skipped, and nothing is fetched from outside Debian's archive.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-openmp-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  iproute2 python3
  clang-14 llvm-14 libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
