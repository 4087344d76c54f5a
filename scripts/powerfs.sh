#!/usr/bin/env bash
# powerfs (tools/powerfs), the FUSE file system that loses unsynced writes on command, for the
# power-loss tests of real processes (tests/powerloss).
#
#   scripts/powerfs.sh install   install libfuse3 and a C compiler if missing, build (once per
#                                source version) and print the binary's path last
#   scripts/powerfs.sh path      print the binary's path if it is built, exit 1 otherwise
#
# Layout: ${KK_CACHE:-~/.cache/kraftkeeper}/powerfs/<hash of the sources>/powerfs, written
# under a temporary name and renamed, so an interrupted build is redone, never half-used.
# Idempotent, and quick when the binary of these sources exists.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$here/tools/powerfs"
cache="${KK_CACHE:-$HOME/.cache/kraftkeeper}"
CFLAGS="-O2 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Werror"

hash="$( (cat "$src"/*.c "$src"/*.h; echo "$CFLAGS") | sha256sum | cut -c1-16)"
bin="$cache/powerfs/$hash/powerfs"

need_packages() {
  local missing=()
  command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
  pkg-config --exists fuse3 2>/dev/null || missing+=(libfuse3-dev)
  [ "${#missing[@]}" -eq 0 ] && return
  echo "installing ${missing[*]} (Debian packages) for powerfs" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
}

install() {
  need_packages  # also when the binary exists: it needs libfuse3 and fusermount3 to run
  if [ ! -x "$bin" ]; then
    mkdir -p "$(dirname "$bin")"
    local tmp="$bin.tmp.$$"
    # shellcheck disable=SC2086  # CFLAGS and pkg-config's output are word lists
    cc $CFLAGS $(pkg-config --cflags fuse3) -o "$tmp" "$src"/*.c $(pkg-config --libs fuse3)
    mv -f "$tmp" "$bin"
    echo "built $bin" >&2
  fi
  echo "$bin"
}

case "${1:-install}" in
  install) install ;;
  path)
    if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
    exit 1
    ;;
  *) echo "usage: $0 install|path" >&2; exit 2 ;;
esac
