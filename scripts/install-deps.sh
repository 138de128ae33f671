#!/usr/bin/env bash
# Installs what building multigrain needs on a fresh Debian/Ubuntu machine:
# libclang-dev (bindgen, used by the userfaultfd crate's bindings) and a Rust toolchain
# check. Idempotent: does nothing when everything is present.
set -euo pipefail

need=()
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)

if ((${#need[@]})); then
  if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "install-deps: need ${need[*]} but not root and no sudo; install them and re-run" >&2; exit 1
  fi
  echo "install-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { $sudo apt-get -o DPkg::Lock::Timeout=600 update >/dev/null && $sudo apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${need[@]}"; }
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install Rust (https://rustup.rs), then re-run" >&2
  exit 1
fi
