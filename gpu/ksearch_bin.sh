#!/usr/bin/env bash
# The release ksearch for the device scripts. Sourced (from the repository root or with ROOT
# set): sets KS and exports KSEARCH_BIN: $KSEARCH_BIN when given, else target/release/ksearch,
# unpacked first from .device-carry/ks/ksearch.xz when that was carried. A device call's carry
# holds 64 MiB with the working tree; one MLX half and the 20 MB binary beside the tree do not
# fit, the packed binary (about 6 MB) does, so the scripts carry ".device-carry/ks".
#
# Prepare here (build, strip, pack):  bash gpu/ksearch_bin.sh pack
# then name ".device-carry/ks" in the call's carry.
_ksb_root=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    [ "${1:-}" = pack ] || { echo "usage: bash gpu/ksearch_bin.sh pack" >&2; exit 2; }
    cd "$_ksb_root"
    cargo build --release -p ksearch-cli
    strip target/release/ksearch
    mkdir -p .device-carry/ks
    xz -T0 -6 -c target/release/ksearch > .device-carry/ks/ksearch.xz
    ls -l .device-carry/ks/ksearch.xz
    exit 0
fi
if [ -z "${KSEARCH_BIN:-}" ] && [ -f "$_ksb_root/.device-carry/ks/ksearch.xz" ]; then
    # Unpacked on every call: a warm machine may keep a binary from an earlier call.
    mkdir -p "$_ksb_root/target/release"
    xz -dc "$_ksb_root/.device-carry/ks/ksearch.xz" > "$_ksb_root/target/release/ksearch.tmp" &&
        chmod +x "$_ksb_root/target/release/ksearch.tmp" &&
        mv "$_ksb_root/target/release/ksearch.tmp" "$_ksb_root/target/release/ksearch"
fi
KS=${KSEARCH_BIN:-$_ksb_root/target/release/ksearch}
export KSEARCH_BIN=$KS
unset _ksb_root
