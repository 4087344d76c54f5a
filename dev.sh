#!/usr/bin/env bash
# The two commands a newcomer needs (see README):
#   ./dev.sh demo [args...]   install only what the demo needs, then run `kraftkeeper demo`
#   ./dev.sh test [pytest args...]   install everything, then lint, type-check and run the tests
#   ./dev.sh test --fast [args...]   lint, type-check and the pure and in-process tests only
#   ./dev.sh install          install everything (what `test` needs)
# Anything slow to build (the test kube-apiserver, etcd, the single-node cluster's kubelet and
# friends) is cached under ${KK_CACHE:-~/.cache/kraftkeeper}; the demo builds none of it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
venv="$here/.venv"
export KK_CACHE="${KK_CACHE:-$HOME/.cache/kraftkeeper}"
export SPARK_LOCAL_IP=127.0.0.1
export PYTHONUNBUFFERED=1
uv_version=0.13.9  # the installer of the project venv (install_python)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

install_python() {
  # The venv is made from a wheelhouse kept in KK_CACHE, one per dependency list (the hash of
  # pyproject.toml): built once with pip, then every venv of that list (a fresh clone, a
  # worktree) is filled from it offline by uv in seconds instead of pip's minute and a half
  # (unpacking and byte-compiling PySpark each time). Without uv it falls back to pip, still
  # offline from the wheelhouse.
  local py="${PYTHON:-python3}" extras=".[operator,spark,dev]"
  local stamp="$venv/.kk-installed" want
  want="$(sha256sum pyproject.toml | cut -c1-16)"
  if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  # The wheelhouse is keyed by the dependency lists alone (a change to the package layout in
  # pyproject.toml reinstalls the venv but reuses the wheels); its name also carries its layout
  # (v2: pip's own wheel is in it).
  local deps
  deps="$("$py" -c 'import hashlib, json, tomllib
d = tomllib.load(open("pyproject.toml", "rb")); p = d["project"]
k = [p.get("dependencies"), p.get("optional-dependencies"), d.get("build-system")]
print(hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16])')"
  local wheels="$KK_CACHE/wheels/$deps-v2" tools="$KK_CACHE/tools/py"
  if [ ! -x "$tools/bin/pip" ]; then
    log "creating the installer venv $tools"
    "$py" -m venv "$tools"
  fi
  if [ ! -d "$wheels" ]; then
    log "building the wheelhouse $wheels (once per dependency list)"
    local building="$wheels.$$"
    rm -rf "$building"
    # setuptools and wheel: the build backend of the editable install, offline later; pip: the
    # image build runs `.venv/bin/python -m pip`.
    "$tools/bin/pip" wheel -q -w "$building" "$extras" "setuptools>=68" wheel pip
    rm -f "$building"/kraftkeeper-*.whl
    mv -T "$building" "$wheels" 2>/dev/null || rm -rf "$building"  # another run made it first
  fi
  # Wheelhouses no install has used for two weeks go (each is about 650 MB).
  touch "$wheels"
  find "$KK_CACHE/wheels" -mindepth 1 -maxdepth 1 -mtime +14 -exec rm -rf {} + 2>/dev/null || true
  case "$("$tools/bin/uv" --version 2>/dev/null)" in
    "uv $uv_version"*) ;;
    *) "$tools/bin/pip" install -q "uv==$uv_version" || log "no uv $uv_version: installing with pip" ;;
  esac
  log "installing kraftkeeper and its dependencies into $venv"
  if [ -x "$tools/bin/uv" ]; then
    export UV_CACHE_DIR="$KK_CACHE/uv"
    [ -x "$venv/bin/python" ] || "$tools/bin/uv" venv -q -p "$py" "$venv"
    "$tools/bin/uv" pip install -q --offline --no-index --find-links "$wheels" \
      --python "$venv/bin/python" -e "$extras" pip
  else
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --no-index --find-links "$wheels" -e "$extras"
  fi
  echo "$want" >"$stamp"
}

install_system() {
  # Java for Spark, Chromium for the report test (the demo needs these and nothing else); with
  # `all`, also etcd + kube-apiserver + helm for the operator tests and the single-node cluster
  # (kubelet, containerd, ...) for the end-to-end tests. Each script is idempotent and quick
  # when everything is present.
  local scripts="scripts/install-system.sh"
  [ "${1:-}" = all ] && scripts="$scripts scripts/k8s-testenv.sh scripts/k8s-node.sh"
  [ "${1:-}" = all ] && scripts="$scripts scripts/kafka.sh"  # Kafka 4.x jars for tests/kafka
  [ "${1:-}" = all ] && scripts="$scripts scripts/powerfs.sh"  # the FUSE power-loss file system, tests/powerloss
  [ "${1:-}" = all ] && scripts="$scripts scripts/cert-manager.sh"  # cert-manager for tests/kubelet
  [ "${1:-}" = all ] && scripts="$scripts scripts/prometheus.sh"  # Prometheus + promtool for the alert tests
  for s in $scripts; do
    if [ -x "$s" ]; then log "$s"; "$s" install; fi
  done
}

cmd="${1:-}"; shift || true
case "$cmd" in
  demo)
    install_python
    install_system demo
    exec "$venv/bin/kraftkeeper" demo "$@"
    ;;
  test)
    started=$SECONDS
    fast=0
    if [ "${1:-}" = --fast ]; then fast=1; shift; fi
    install_python
    # The fast lane installs nothing else: it runs no Kubernetes, Kafka, Spark or browser.
    [ "$fast" = 1 ] || install_system all
    log "ruff"
    "$venv/bin/ruff" check quorum operator reports demos tests bench testkit
    log "mypy (strict)"
    # Its cache under KK_CACHE, one per checkout path (two checkouts never write one at once).
    # A new path starts from a copy of the newest: mypy trusts an entry whose file hash still
    # matches, whatever the path, so a fresh clone checks in seconds, not half a minute.
    mypy_cache="$KK_CACHE/mypy/$(printf %s "$here" | sha256sum | cut -c1-12)"
    if [ ! -d "$mypy_cache" ]; then
      # (`|| true`: on a machine's first run there is no cache yet, and ls fails under pipefail)
      newest="$(ls -td "$KK_CACHE"/mypy/*/ 2>/dev/null | head -1)" || true
      if [ -n "$newest" ] && cp -r "$newest" "$mypy_cache.$$"; then
        mv -T "$mypy_cache.$$" "$mypy_cache" 2>/dev/null || rm -rf "$mypy_cache.$$"
      fi
    fi
    "$venv/bin/mypy" --cache-dir "$mypy_cache"
    log "pytest"
    rc=0
    # Two workers, one per core (tests/conftest.py says what may run side by side, and why).
    xdist=(-n 2 --dist loadgroup --no-loadscope-reorder)
    if [ "$fast" = 1 ]; then
      # The pure and in-process tests: the core, storage, simulations, scenarios, decoders,
      # security, the client, the operator's decisions over its in-memory model, the documents and
      # the layout's rules (import directions, module sizes, what a start imports).
      # Anything marked slow (real processes), k8s, spark, browser or docker is left to the
      # whole suite.
      KK_FAST_LANE=1 "$venv/bin/pytest" "${xdist[@]}" -m "not slow and not k8s and not spark and not browser and not docker" \
        --durations=5 tests/sim tests/docs tests/structure tests/ports tests/core tests/storage tests/security \
        tests/operator tests/fuzz tests/scenarios tests/client "$@" || rc=$?
    else
      # The image tests install Debian's docker.io and build the debootstrap base image when they
      # are missing (cached afterwards): CI runs them too, not only machines that have the cache.
      export KK_DOCKER_TESTS="${KK_DOCKER_TESTS:-1}"
      # The end-to-end tests on the single-node cluster (tests/kubelet) fail rather than skip
      # when something they need is missing: everything was installed just above.
      export KK_NODE_TESTS="${KK_NODE_TESTS:-1}"
      # The 25 slowest tests are listed at the end, to keep the suite's time in view. Two workers
      # (36 against 49 minutes of pytest on one); KK_TEST_WORKERS=1 runs it on one, in order.
      whole=("${xdist[@]}")
      [ "${KK_TEST_WORKERS:-2}" = 1 ] && whole=()
      "$venv/bin/pytest" "${whole[@]}" --durations=25 "$@" || rc=$?
    fi
    elapsed=$((SECONDS - started))
    lane=$([ "$fast" = 1 ] && echo "fast lane" || echo "whole run")
    log "$lane: $((elapsed / 60)) min $((elapsed % 60)) s (installs, ruff, mypy and pytest), exit $rc"
    exit "$rc"
    ;;
  install)
    install_python
    install_system all
    ;;
  *)
    echo "usage: ./dev.sh demo [--dir DIR] [--recoveries K] | ./dev.sh test [--fast] [pytest args] | ./dev.sh install" >&2
    exit 2
    ;;
esac
