#!/usr/bin/env bash
# Installs the Debian packages the build and tests need. Idempotent: packages that are
# already installed are skipped, and nothing is fetched from outside Debian's archive.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-openmp-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libboost-dev zlib1g-dev
  iproute2 python3 curl
  clang-14 llvm-14 libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# References for the tokenizer and chat-template tests (Debian's packages unless present).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi
if ! python3 -c 'import jinja2' 2>/dev/null; then
  missing+=(python3-jinja2)
fi
if [ ${#missing[@]} -eq 0 ]; then
  "$(dirname "$0")/setup_tokenizer_data.sh"
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
"$(dirname "$0")/setup_tokenizer_data.sh"
