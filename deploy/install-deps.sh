#!/usr/bin/env bash
# Installs every Debian 12 package Strata builds, tests and benchmarks with.
# Idempotent and non-interactive; runs `apt-get update` at most once per call
# and only when something is missing. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config ccache git
  clang-14 libclang-rt-14-dev clang-format clang-tidy
  # control plane (DESIGN §7)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # data plane, RDMA discovery, SSD tier, index
  libucx-dev ucx-utils libibverbs-dev liburing-dev librocksdb-dev
  # hashing, checksums, logging, CLI, config, HTTP
  libssl-dev openssl libxxhash-dev libspdlog-dev libfmt-dev libcli11-dev
  libyaml-cpp-dev libcpp-httplib-dev nlohmann-json3-dev
  # tests and benchmarks (baselines: Redis, fio; cluster: etcd)
  libgtest-dev libgmock-dev libbenchmark-dev
  redis-server libhiredis-dev fio etcd-server etcd-client
  # the main job's HTTP example
  curl
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The etcd and redis packages start system services; Strata's tests start
# their own instances on private ports, so leave the system ones alone.
echo "install-deps: done"
