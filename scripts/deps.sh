#!/usr/bin/env bash
# deps.sh: install the Debian (bookworm) packages qforge builds and tests with, when missing.
# Needs root for apt-get; does nothing when everything is already there.
set -euo pipefail
pkgs=(build-essential pkg-config clang libclang-rt-14-dev libopenmpi-dev openmpi-bin
      libopenblas-dev libpcre2-dev libcbor-dev libssl-dev libcurl4-openssl-dev libjansson-dev
      libxxhash-dev python3 python3-cbor2)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps.sh: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
    echo "deps.sh: run as root (or install: ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
