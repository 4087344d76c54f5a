#!/usr/bin/env bash
# Installs what bench/engine.py compares against: wrk (the C load generator) and etcd-server
# (the etcd peer), both from Debian. Idempotent: does nothing when both are present.
#   scripts/install-bench.sh install   install if missing
#   scripts/install-bench.sh check     exit 0 if everything is present, 1 otherwise
# Not run by CI: the bench smoke test needs only the kraftkeeper side.
set -euo pipefail

need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
# Debian installs the server as /usr/bin/etcd.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)

case "${1:-install}" in
  check)
    if [ "${#need[@]}" -eq 0 ]; then echo "bench tools present"; exit 0; fi
    echo "missing: ${need[*]}" >&2; exit 1
    ;;
  install)
    if [ "${#need[@]}" -eq 0 ]; then exit 0; fi
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    # The package also enables a systemd unit for a system-wide etcd on :2379. The benchmark
    # starts its own members on free loopback ports, so whether that service runs does not matter.
    $sudo apt-get update -q
    $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
    ;;
  *)
    echo "usage: $0 install|check" >&2; exit 2
    ;;
esac
