#!/usr/bin/env bash
# cert-manager's controller for the end-to-end tests on the single-node cluster (tests/kubelet).
#
#   scripts/cert-manager.sh install    build the controller and copy cert-manager's CRDs
#                                      (idempotent, cached)
#   scripts/cert-manager.sh check      exit 0 when both are present at the pinned version
#   scripts/cert-manager.sh env        print `export KK_CERT_MANAGER=... KK_CERT_MANAGER_CRDS=...`
#
# Built like the Kubernetes binaries (scripts/k8s-testenv.sh) from the Go module proxy, through
# the wrapper module tools/cert-manager: cert-manager's own `cmd/controller` is a separate module
# the proxy does not serve, so tools/cert-manager/main.go wires the published controller packages
# (Issuer, CertificateRequest approver + CA signer, the Certificate controllers) itself.
# Binary: $KK_CACHE/bin/cert-manager-controller with a stamp of the pin and the wrapper's
# sources; CRDs: $KK_CACHE/cert-manager-crds/ (deploy/crds of the same module version).
# GOPROXY is taken from the environment; nothing here names a host.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${KK_CACHE:-$HOME/.cache/kraftkeeper}"
bin="$cache/bin"
crds="$cache/cert-manager-crds"
wrapper="$here/tools/cert-manager"
module=github.com/cert-manager/cert-manager

log() { printf '==> [cert-manager %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

version() { sed -n "s|^require $module \(v[0-9.]*\).*|\1|p; s|^[[:space:]]*$module \(v[0-9.]*\)\$|\1|p" "$wrapper/go.mod" | head -n1; }
stamp() { printf '%s %s\n' "$(version)" "$(cat "$wrapper/go.mod" "$wrapper/go.sum" "$wrapper/main.go" | sha256sum | cut -c1-16)"; }
built() {
  [ -x "$bin/cert-manager-controller" ] && [ -f "$bin/cert-manager-controller.version" ] &&
    [ "$(cat "$bin/cert-manager-controller.version")" = "$(stamp)" ] &&
    [ -f "$crds/version" ] && [ "$(cat "$crds/version")" = "$(version)" ]
}

install() {
  built && return 0
  command -v go >/dev/null 2>&1 || { echo "cert-manager.sh: go is needed to build the controller" >&2; return 1; }
  local v start dir; v="$(version)"; start="$(date +%s)"
  log "building cert-manager-controller $v from the Go module proxy (once)"
  mkdir -p "$bin"
  (
    cd "$wrapper"
    export GOFLAGS=-mod=mod
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$bin/cert-manager-controller.tmp" .
  )
  mv "$bin/cert-manager-controller.tmp" "$bin/cert-manager-controller"
  # The CRDs of the same version, from the module the build just used.
  dir="$(cd "$wrapper" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' "$module")"
  rm -rf "$crds"; mkdir -p "$crds"
  cp "$dir"/deploy/crds/*.yaml "$crds/"
  chmod -R u+w "$crds"
  echo "$v" >"$crds/version"
  stamp >"$bin/cert-manager-controller.version"
  log "cert-manager-controller built in $(( $(date +%s) - start )) s"
}

case "${1:-install}" in
  install) install ;;
  check)
    if built; then echo "ok: cert-manager-controller $(version), CRDs in $crds"; exit 0; fi
    echo "missing: $bin/cert-manager-controller $(version) or its CRDs"; exit 1
    ;;
  env) echo "export KK_CERT_MANAGER='$bin/cert-manager-controller' KK_CERT_MANAGER_CRDS='$crds'" ;;
  *) echo "usage: $0 install|check|env" >&2; exit 2 ;;
esac
