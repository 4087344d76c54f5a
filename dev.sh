#!/usr/bin/env bash
# The two commands a newcomer needs (see README):
#   ./dev.sh demo [args...]   install only what the demo needs, then run `kraftkeeper demo`
#   ./dev.sh test [pytest args...]   install everything, then lint, type-check and run the tests
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

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

install_python() {
  local py="${PYTHON:-python3}"
  if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    "$py" -m venv "$venv"
  fi
  # Reinstall only when the dependency list changed.
  local stamp="$venv/.kk-installed" want
  want="$(sha256sum pyproject.toml | cut -c1-16)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing kraftkeeper and its dependencies into $venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -e ".[operator,spark,dev]"
    echo "$want" >"$stamp"
  fi
}

install_system() {
  # Java for Spark, Chromium for the report test (the demo needs these and nothing else); with
  # `all`, also etcd + kube-apiserver + helm for the operator tests and the single-node cluster
  # (kubelet, containerd, ...) for the end-to-end tests. Each script is idempotent and quick
  # when everything is present.
  local scripts="scripts/install-system.sh"
  [ "${1:-}" = all ] && scripts="$scripts scripts/k8s-testenv.sh scripts/k8s-node.sh"
  [ "${1:-}" = all ] && scripts="$scripts scripts/kafka.sh"  # Kafka 4.x jars for tests/kafka
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
    install_python
    install_system all
    log "ruff"
    "$venv/bin/ruff" check quorum operator reports tests bench
    log "mypy (strict)"
    # Its cache under KK_CACHE, one per checkout path: a fresh clone at the same path reuses it
    # (mypy trusts an entry whose file hash still matches), 16 s cold against 0.5 s warm.
    "$venv/bin/mypy" --cache-dir "$KK_CACHE/mypy/$(printf %s "$here" | sha256sum | cut -c1-12)"
    log "pytest"
    # The image tests install Debian's docker.io and build the debootstrap base image when they
    # are missing (cached afterwards): CI runs them too, not only machines that have the cache.
    export KK_DOCKER_TESTS="${KK_DOCKER_TESTS:-1}"
    # The end-to-end tests on the single-node cluster (tests/kubelet) fail rather than skip
    # when something they need is missing: everything was installed just above.
    export KK_NODE_TESTS="${KK_NODE_TESTS:-1}"
    # The 25 slowest tests are listed at the end, to keep the suite's time in view (CI: ~30 min).
    exec "$venv/bin/pytest" --durations=25 "$@"
    ;;
  install)
    install_python
    install_system all
    ;;
  *)
    echo "usage: ./dev.sh demo [--dir DIR] [--recoveries K] | ./dev.sh test [pytest args] | ./dev.sh install" >&2
    exit 2
    ;;
esac
