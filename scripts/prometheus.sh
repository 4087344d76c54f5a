#!/usr/bin/env bash
# Prometheus and promtool for the alerting tests (tests/alerts: `promtool test rules` over the
# chart's PrometheusRule; tests/kubelet: a real Prometheus scraping the operator and the quorum
# pods of the single-node cluster).
#
#   scripts/prometheus.sh install   build both (idempotent, cached)
#   scripts/prometheus.sh check     exit 0 when both are present at the pinned version
#   scripts/prometheus.sh env       print `export PATH=...` for the cached binaries
#
# Choices:
#   - both are built with `go install` of the pinned Prometheus module from the Go module proxy
#     (its go.mod has no replace or exclude directive, so no wrapper module is needed, unlike the
#     Kubernetes binaries in scripts/k8s-node.sh), into $KK_CACHE/bin with a version stamp;
#   - build tags `remove_all_sd,enable_kubernetes_sd`: of the service discoveries only the
#     static, file, http and Kubernetes ones are compiled in (Prometheus' own plugin tags;
#     promtool imports the Kubernetes one in any case). This leaves out the cloud SDKs, which
#     are most of a full build on 2 cores;
#   - no `builtinassets` tag: the web UI's compiled assets are not in the module (they are built
#     by npm in Prometheus' own release process), and nothing here needs the UI: the tests use
#     the HTTP API (/api/v1/alerts, /api/v1/query) only.
# GOPROXY is taken from the environment; nothing here names a host.
set -euo pipefail

cache="${KK_CACHE:-$HOME/.cache/kraftkeeper}"
bin="$cache/bin"
# Prometheus 3.16.0 (its Go module numbers 3.x releases as v0.3xx.y).
module=github.com/prometheus/prometheus
version=v0.316.0
release=3.16.0
tags=remove_all_sd,enable_kubernetes_sd
stamp="$version $tags"

log() { printf '==> [prometheus %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

built() {
  [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ] && [ -f "$bin/prometheus.version" ] &&
    [ "$(cat "$bin/prometheus.version")" = "$stamp" ]
}

install_all() {
  built && return 0
  command -v go >/dev/null 2>&1 || { echo "prometheus.sh: go is needed to build Prometheus" >&2; return 1; }
  local start tmp; start="$(date +%s)"; tmp="$bin/prometheus.tmp"
  log "building prometheus and promtool $version from the Go module proxy (once; several minutes on 2 cores)"
  mkdir -p "$tmp"
  # One `go install` for both: they share most compiled packages. nice: the machine is shared.
  # The version flags make `prometheus --version` and /api/v1/status/buildinfo report the pin.
  GOBIN="$tmp" GOFLAGS=-mod=mod nice -n 10 go install -trimpath -tags "$tags" \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release \
              -X github.com/prometheus/common/version.Branch=module-proxy" \
    "$module/cmd/prometheus@$version" "$module/cmd/promtool@$version"
  mv "$tmp/prometheus" "$bin/prometheus"
  mv "$tmp/promtool" "$bin/promtool"
  rmdir "$tmp" 2>/dev/null || true
  echo "$stamp" >"$bin/prometheus.version"
  log "prometheus and promtool built in $(( $(date +%s) - start )) s"
}

case "${1:-install}" in
  install) install_all ;;
  check)
    if built; then echo "ok: prometheus and promtool $version in $bin"; else echo "missing: $bin/prometheus, $bin/promtool $version"; exit 1; fi
    ;;
  env) echo "export PATH='$bin':\"\$PATH\"" ;;
  *) echo "usage: $0 install|check|env" >&2; exit 2 ;;
esac
