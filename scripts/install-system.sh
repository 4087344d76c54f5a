#!/usr/bin/env bash
# System packages the recovery reports need, for ./dev.sh (which calls `install`):
#   - Java 17 or newer: PySpark 4 runs its JVM on it.
#   - Debian's `chromium`: the browser test opens the HTML report headless.
# Idempotent and quick when everything is present: `apt-get update` runs only when something
# is missing. Root is assumed (CI containers and the dev machines run as root).
set -euo pipefail

java_major() {
  # `java -version` prints e.g.: openjdk version "17.0.15" 2025-04-15 (or "1.8.0_392" for 8).
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  local v
  v="$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)"
  case "$v" in
    1.*) echo "${v#1.}" | cut -d. -f1 ;;
    "") echo 0 ;;
    *) echo "$v" | cut -d. -f1 | cut -d- -f1 ;;
  esac
}

have_chromium() { command -v chromium >/dev/null 2>&1; }

missing=()
if [ "$(java_major)" -lt 17 ]; then missing+=(openjdk-17-jre-headless); fi
if ! have_chromium; then missing+=(chromium); fi

case "${1:-install}" in
  check)
    if [ "${#missing[@]}" -eq 0 ]; then echo "ok: java $(java_major), chromium present"; exit 0; fi
    echo "missing: ${missing[*]}"; exit 1
    ;;
  install)
    if [ "${#missing[@]}" -eq 0 ]; then exit 0; fi
    echo "installing: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Other installers may hold the dpkg lock (dev.sh runs several): wait for it rather than
    # fail, and retry once after finishing any interrupted configuration.
    apt_opts=(-y -qq --no-install-recommends -o DPkg::Lock::Timeout=300)
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    # fonts-dejavu-core: chromium without recommends has no font to render the report's text.
    if ! apt-get install "${apt_opts[@]}" "${missing[@]}" fonts-dejavu-core >/dev/null; then
      dpkg --configure -a || true
      apt-get install "${apt_opts[@]}" "${missing[@]}" fonts-dejavu-core >/dev/null
    fi
    ;;
  *)
    echo "usage: $0 install|check" >&2; exit 2
    ;;
esac
