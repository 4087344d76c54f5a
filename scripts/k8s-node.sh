#!/usr/bin/env bash
# A real single-node Kubernetes v1.30 on this machine, for the end-to-end tests (tests/kubelet/):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet + containerd, kube-proxy
# and CoreDNS, all as host processes; pods on a private CNI bridge that never leaves the machine.
#
#   scripts/k8s-node.sh install           install / build everything (idempotent, cached)
#   scripts/k8s-node.sh check             exit 0 when everything is installed at the pinned versions
#   scripts/k8s-node.sh up                start the cluster (does nothing when it already runs);
#                                         prints the admin kubeconfig path
#   scripts/k8s-node.sh down              stop everything by PID, unmount, remove the pods'
#                                         network namespaces, the KUBE-* iptables chains, the nft
#                                         tables and cgroups the cluster made, restore sysctls
#   scripts/k8s-node.sh status            exit 0 when every component runs and the node is Ready
#   scripts/k8s-node.sh load-image IMAGE  import a local Docker image into the node's containerd
#   scripts/k8s-node.sh env               print `export KUBECONFIG=... PATH=...`
#
# Where things are: binaries in $KK_CACHE/bin (default ~/.cache/kraftkeeper/bin), built like
# kube-apiserver (scripts/k8s-testenv.sh) from the Go module proxy through the wrapper modules
# tools/k8s-node (kubelet, kube-controller-manager, kube-scheduler, kube-proxy), tools/coredns
# and tools/pause; the running cluster under $KK_NODE_DIR (default /var/lib/kraftkeeper-node),
# containerd's state under /run/kraftkeeper-containerd; logs of the last run are kept in
# $KK_NODE_DIR.logs after `down`.
#
# Choices, each found by trying it on these machines:
#   - Debian's containerd 1.6 + runc, CRI on, `restrict_oom_score_adj = true` (no
#     CAP_SYS_RESOURCE here: without it every sandbox fails "can't get final child's PID");
#   - kubelet: cgroupfs driver, swap check off, `--hostname-override=127.0.0.1` (node name and
#     InternalIP 127.0.0.1), Node authorizer identity system:node:127.0.0.1;
#   - network: bridge kkbr0 with 10.244.0.1/16 (pods 10.244.0.10+), no default route in pods and
#     no masquerade; the only route pods get besides their subnet is the Service range via the
#     bridge. The apiserver listens on and advertises the bridge address (the `kubernetes`
#     Service refuses loopback endpoints); kube-proxy (iptables mode) routes Services; CoreDNS
#     answers cluster.local on the bridge address and nothing else. FORWARD accepts traffic
#     inside the bridge (Docker's DROP policy with bridge-nf-call-iptables=1 would drop it) and
#     drops anything that tries to leave it; the Service range is routed onto the bridge, so an
#     unanswered ClusterIP packet never reaches another interface either;
#   - images: no registry is reachable, so the `pause` sandbox image is made from a static
#     binary and every image is imported with `ctr -n k8s.io images import` (pods use
#     imagePullPolicy: Never);
#   - storage: 32 pre-made `local` PersistentVolumes (root-owned 0755 directories) behind the
#     default StorageClass `kk-local` (WaitForFirstConsumer). Each PV is used once: a deleted
#     claim leaves its PV Released, so a re-created claim always gets a fresh, empty volume.
# GOPROXY is taken from the environment; nothing here names a host.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${KK_CACHE:-$HOME/.cache/kraftkeeper}"
bin="$cache/bin"
run="${KK_NODE_DIR:-/var/lib/kraftkeeper-node}"
cstate=/run/kraftkeeper-containerd
sock="$cstate/containerd.sock"
bridge=kkbr0
gw=10.244.0.1
pod_cidr=10.244.0.0/16
svc_cidr=10.96.0.0/16
node_name=127.0.0.1
sandbox_image=kraftkeeper.local/pause:1
pv_count="${KK_NODE_PVS:-32}"
coredns_version=v1.11.3
# Sysctls the kubelet, kube-proxy or this script may change; `down` writes back what `up` saw.
sysctls="vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.ipv4.conf.all.route_localnet
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait"
components="etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns"

log() { printf '==> [k8s-node %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'k8s-node: %s\n' "$*" >&2; exit 1; }
# A command that stops the script under `set -e` names itself, its function and line: a bare
# exit 1 after "cleaning it up first" once left a failed `up` unexplained. Only the script's own
# shell reports (a command failing inside $(...) is the caller's to judge).
set -E
trap 'rc=$?; [ "$BASH_SUBSHELL" = 0 ] && printf "k8s-node: exit %d in %s, line %d: %s\n" "$rc" "${FUNCNAME[0]:-main}" "$LINENO" "$BASH_COMMAND" >&2' ERR

# -- install -------------------------------------------------------------------------------------

k8s_version() { sed -n 's/^[[:space:]]*\(require \)\{0,1\}k8s.io\/kubernetes \(v[0-9.]*\).*/\2/p' "$here/tools/k8s-node/go.mod" | head -n1; }
# A stamp per wrapper module: the pin plus a hash of its sources, so an edit triggers a rebuild.
stamp_of() { find "$1" -name '*.go' -o -name go.mod -o -name go.sum | sort | xargs cat | sha256sum | cut -c1-16; }
built() {  # built NAME MODULE_DIR
  [ -x "$bin/$1" ] && [ -f "$bin/$1.version" ] && [ "$(cat "$bin/$1.version")" = "$(stamp_of "$2")" ]
}
node_bins="kubelet kube-controller-manager kube-scheduler kube-proxy"
node_built() { local b; for b in $node_bins; do built "$b" "$here/tools/k8s-node" || return 1; done; }

install_packages() {
  local missing=""
  command -v containerd >/dev/null 2>&1 || missing="$missing containerd"
  command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing="$missing runc"
  [ -x /usr/lib/cni/bridge ] || missing="$missing containernetworking-plugins"
  command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
  command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
  command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
  [ -z "$missing" ] && return 0
  log "installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  # Other installers may hold the dpkg lock (dev.sh runs several, tests install Docker): wait.
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  # shellcheck disable=SC2086
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $missing >/dev/null
}

# The node binaries are built with Go's default cgo setting, like kube-apiserver: they then share
# most compiled packages with its build in the Go cache (about 5 instead of 12 minutes cold on 2
# busy cores). CoreDNS and pause are built static (CGO_ENABLED=0): pause runs inside an image
# that holds nothing else.
go_build() {  # go_build MODULE_DIR OUT_DIR PACKAGES...  (nice: the machine is shared, 2 cores)
  local dir="$1" out="$2"; shift 2
  command -v go >/dev/null 2>&1 || die "go is needed to build the cluster's binaries"
  local v minor; v="$(k8s_version)"; minor="${v#v1.}"; minor="${minor%%.*}"
  (
    cd "$dir"
    # The checksum database does not know k8s.io/kube-proxy v0.30.x although the module proxy
    # serves it; go.sum in the wrapper pins its hash instead.
    export GOFLAGS=-mod=mod GONOSUMDB=k8s.io/kube-proxy
    nice -n 10 go build -trimpath \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$v \
                -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      -o "$out/" "$@"
  )
}

build_node() {
  node_built && return 0
  local start tmp b; start="$(date +%s)"; tmp="$bin/node.tmp"
  log "building $node_bins $(k8s_version) (once; several minutes on 2 cores with a cold Go cache)"
  mkdir -p "$tmp"
  go_build "$here/tools/k8s-node" "$tmp" ./cmd/...
  for b in $node_bins; do
    mv "$tmp/$b" "$bin/$b"
    stamp_of "$here/tools/k8s-node" >"$bin/$b.version"
  done
  rmdir "$tmp" 2>/dev/null || true
  log "node binaries built in $(( $(date +%s) - start )) s"
}

build_small() {  # build_small NAME MODULE_DIR
  built "$1" "$2" && return 0
  local start; start="$(date +%s)"
  log "building $1 from $2"
  mkdir -p "$bin/$1.tmp"
  CGO_ENABLED=0 go_build "$2" "$bin/$1.tmp" .
  mv "$bin/$1.tmp/$(basename "$2")" "$bin/$1"
  rmdir "$bin/$1.tmp"
  stamp_of "$2" >"$bin/$1.version"
  log "$1 built in $(( $(date +%s) - start )) s"
}

pause_tar() { echo "$bin/pause-image.tar"; }
build_pause_image() {
  if [ -f "$(pause_tar)" ] && [ "$(pause_tar)" -nt "$bin/pause" ]; then return 0; fi
  python3 "$here/scripts/oci-image.py" --name "$sandbox_image" --out "$(pause_tar)" \
    --file "$bin/pause:/pause:0755" --entrypoint /pause
}

install_all() {
  install_packages
  "$here/scripts/k8s-testenv.sh" install   # etcd, kube-apiserver, helm, kubectl
  mkdir -p "$bin"
  build_node
  build_small coredns "$here/tools/coredns"
  build_small pause "$here/tools/pause"
  build_pause_image
}

check_all() {
  local ok=0 b
  "$here/scripts/k8s-testenv.sh" check >/dev/null || { echo "missing: etcd/kube-apiserver/helm/kubectl (scripts/k8s-testenv.sh check)"; ok=1; }
  for b in containerd iptables ip openssl; do command -v "$b" >/dev/null 2>&1 || { echo "missing: $b"; ok=1; }; done
  [ -x /usr/sbin/runc ] || command -v runc >/dev/null 2>&1 || { echo "missing: runc"; ok=1; }
  [ -x /usr/lib/cni/bridge ] || { echo "missing: containernetworking-plugins"; ok=1; }
  node_built || { echo "missing: $node_bins $(k8s_version) in $bin"; ok=1; }
  built coredns "$here/tools/coredns" || { echo "missing: $bin/coredns"; ok=1; }
  built pause "$here/tools/pause" || { echo "missing: $bin/pause"; ok=1; }
  [ -f "$(pause_tar)" ] || { echo "missing: $(pause_tar)"; ok=1; }
  [ "$ok" = 0 ] && echo "ok: single-node cluster binaries $(k8s_version), CoreDNS $coredns_version, containerd $(containerd --version | awk '{print $3}')"
  return "$ok"
}

# -- helpers for up / down ------------------------------------------------------------------------

# The product's allocator (quorum/localports.py, standard library only): a port below the kernel's
# ephemeral range, which the tests' and the benches' outgoing connections cannot take between
# this probe and the server's bind (a kernel-chosen port 0 comes from that very range).
# All of the cluster's ports in one draw, above the kernel's ephemeral range: test workers beside
# the cluster draw theirs below it, so none of them can take one of these between this probe and
# the component's bind (once another worker's etcd took the cluster's etcd port, and the API
# server wrote into that etcd).
free_ports() {  # free_ports N : N distinct free ports, one per line
  PYTHONPATH="$here" python3 -c 'import sys; from quorum.localports import free_ports
print("\n".join(map(str, free_ports(int(sys.argv[1]), above_ephemeral=True))))' "$1"
}
alive() { [ -f "$run/pids/$1" ] && kill -0 "$(cat "$run/pids/$1")" 2>/dev/null; }
spawn() {  # spawn NAME CMD... : start in the background, record the pid, log to logs/NAME.log
  local name="$1"; shift
  "$@" 9>&- >"$run/logs/$name.log" 2>&1 &   # 9: the up/down lock (exclusive), never a component's
  echo $! >"$run/pids/$name"
}
wait_until() {  # wait_until WHAT SECONDS COMPONENT CMD...
  local what="$1" secs="$2" comp="$3"; shift 3
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$comp" ] && ! alive "$comp"; then
      tail -n 30 "$run/logs/$comp.log" >&2 || true
      die "$comp exited while waiting for $what (log: $run/logs/$comp.log)"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after $secs s waiting for $what"
    sleep 0.5
  done
}
kc() { "$bin/kubectl" --kubeconfig "$run/kubeconfig" "$@"; }

kubeconfig() {  # kubeconfig FILE USER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kk
  cluster: {server: "https://$gw:$(cat "$run/ports/apiserver")", certificate-authority: "$run/certs/ca.crt"}
users:
- name: $2
  user: {token: "$3"}
contexts:
- name: kk
  context: {cluster: kk, user: $2}
current-context: kk
EOF
  chmod 0600 "$1"
}

make_certs() {
  local c="$run/certs"
  mkdir -p "$c"; chmod 0700 "$c"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$c/ca.key" -out "$c/ca.crt" -days 30 \
    -subj "/CN=kraftkeeper-test-node-ca" 2>/dev/null
  # The apiserver's serving certificate: pods verify it against kube-root-ca.crt as
  # kubernetes.default.svc or the Service's ClusterIP.
  cat >"$c/apiserver.ext" <<EOF
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1,IP:$gw,IP:127.0.0.1
extendedKeyUsage=serverAuth
EOF
  openssl req -newkey rsa:2048 -nodes -keyout "$c/apiserver.key" -out "$c/apiserver.csr" -subj "/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in "$c/apiserver.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
    -out "$c/apiserver.crt" -days 30 -extfile "$c/apiserver.ext" 2>/dev/null
  # The apiserver's client certificate towards the kubelet (exec, logs, port-forward).
  printf 'extendedKeyUsage=clientAuth\n' >"$c/client.ext"
  openssl req -newkey rsa:2048 -nodes -keyout "$c/kubelet-client.key" -out "$c/kubelet-client.csr" \
    -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
  openssl x509 -req -in "$c/kubelet-client.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
    -out "$c/kubelet-client.crt" -days 30 -extfile "$c/client.ext" 2>/dev/null
  openssl genrsa -out "$c/sa.key" 2048 2>/dev/null
  openssl rsa -in "$c/sa.key" -pubout -out "$c/sa.pub" 2>/dev/null
  # Static tokens, one identity per component (the apiserver's RBAC bootstrap roles know them).
  local t; : >"$c/tokens.csv"
  for t in "admin|kk-admin|system:masters" "node|system:node:$node_name|system:nodes" \
           "kcm|system:kube-controller-manager|" "scheduler|system:kube-scheduler|" \
           "proxy|system:kube-proxy|" "coredns|kk-coredns|"; do
    local key user group tok
    IFS='|' read -r key user group <<<"$t"
    tok="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    echo "$tok,$user,$user,\"$group\"" >>"$c/tokens.csv"
    echo "$key $user $tok" >>"$c/identities"
  done
  chmod 0600 "$c"/*
}

token_of() { awk -v k="$1" '$1 == k {print $3}' "$run/certs/identities"; }
user_of() { awk -v k="$1" '$1 == k {print $2}' "$run/certs/identities"; }

save_host_state() {
  mkdir -p "$run/saved"
  local s v
  for s in $sysctls; do
    v="$(sysctl -n "$s" 2>/dev/null)" || continue
    printf '%s=%s\n' "$s" "$v" >>"$run/saved/sysctls"
  done
  if command -v nft >/dev/null 2>&1; then nft list tables >"$run/saved/nft-tables" 2>/dev/null || true; fi
  for s in /sys/fs/cgroup/*/kubepods; do [ -d "$s" ] && echo "$s"; done >"$run/saved/cgroups" || true
  ip netns list 2>/dev/null | awk '{print $1}' >"$run/saved/netns" || true
  [ -d /var/log/pods ] && touch "$run/saved/var-log-pods-existed" || true
}

setup_network() {
  modprobe br_netfilter 2>/dev/null || true
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] ||
    die "the kernel lacks br_netfilter (no /proc/sys/net/bridge): kube-proxy cannot route Services between pods"
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.ipv4.ip_forward=1
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  ip addr replace "$gw/16" dev "$bridge"
  ip link set "$bridge" up
  # An unanswered ClusterIP packet goes onto the bridge and dies there, never out of the machine.
  ip route replace "$svc_cidr" dev "$bridge"
  # KK-NODE: traffic within the bridge passes (Docker's FORWARD policy is DROP), nothing that
  # came from the bridge may be forwarded anywhere else, and nothing is forwarded into it.
  iptables -N KK-NODE 2>/dev/null || iptables -F KK-NODE
  iptables -A KK-NODE -i "$bridge" -o "$bridge" -j ACCEPT
  iptables -A KK-NODE -i "$bridge" -j DROP
  iptables -A KK-NODE -o "$bridge" -j DROP
  iptables -C FORWARD -j KK-NODE 2>/dev/null || iptables -I FORWARD 1 -j KK-NODE
  mkdir -p "$run/cni/net.d" "$run/cni/ipam"
  cat >"$run/cni/net.d/10-kraftkeeper.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kraftkeeper-pods",
  "plugins": [{
    "type": "bridge", "bridge": "$bridge", "isGateway": true, "isDefaultGateway": false,
    "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": "$run/cni/ipam",
             "ranges": [[{"subnet": "$pod_cidr", "rangeStart": "10.244.0.10", "gateway": "$gw"}]],
             "routes": [{"dst": "$svc_cidr", "gw": "$gw"}]}
  }]
}
EOF
}

start_containerd() {
  mkdir -p "$run/containerd" "$cstate"
  cat >"$run/containerd/config.toml" <<EOF
version = 2
root = "$run/containerd/root"
state = "$cstate"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$sandbox_image"
  # Needed on machines without CAP_SYS_RESOURCE (runc cannot lower oom_score_adj otherwise).
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc || echo /usr/sbin/runc)"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$run/cni/net.d"
EOF
  spawn containerd containerd --config "$run/containerd/config.toml"
  wait_until "containerd" 60 containerd ctr --address "$sock" version
  ctr --address "$sock" -n k8s.io images import "$(pause_tar)" >/dev/null
}

start_control_plane() {
  local c="$run/certs" p names=(etcd etcd-peer apiserver kubelet kubelet-healthz kcm scheduler proxy-healthz proxy-metrics coredns-ready coredns-health)
  mkdir -p "$run/ports"
  local ports; mapfile -t ports < <(free_ports "${#names[@]}")
  [ "${#ports[@]}" = "${#names[@]}" ] || die "could not draw ${#names[@]} free loopback ports"
  for p in "${!names[@]}"; do echo "${ports[$p]}" >"$run/ports/${names[$p]}"; done
  local etcd_port; etcd_port="$(cat "$run/ports/etcd")"
  spawn etcd etcd --data-dir "$run/etcd" --name kk \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$(cat "$run/ports/etcd-peer")" \
    --initial-advertise-peer-urls "http://127.0.0.1:$(cat "$run/ports/etcd-peer")" \
    --initial-cluster "kk=http://127.0.0.1:$(cat "$run/ports/etcd-peer")"
  # The API server starts only on our own etcd: one that lost its port to another program exits,
  # and a health answer on that port would then come from the other program.
  wait_until "etcd /health on port $etcd_port" 60 etcd curl -sf "http://127.0.0.1:$etcd_port/health"
  alive etcd || { tail -n 30 "$run/logs/etcd.log" >&2 || true; die "etcd exited after its port answered (log: $run/logs/etcd.log)"; }
  spawn kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$gw" --advertise-address "$gw" --secure-port "$(cat "$run/ports/apiserver")" \
    --tls-cert-file "$c/apiserver.crt" --tls-private-key-file "$c/apiserver.key" \
    --client-ca-file "$c/ca.crt" --token-auth-file "$c/tokens.csv" \
    --kubelet-client-certificate "$c/kubelet-client.crt" --kubelet-client-key "$c/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-account-key-file "$c/sa.pub" --service-account-signing-key-file "$c/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range "$svc_cidr" \
    --enable-priority-and-fairness=false --profiling=false
  local key
  for key in admin node kcm scheduler proxy coredns; do
    kubeconfig "$run/kubeconfig-$key" "$(user_of "$key")" "$(token_of "$key")"
  done
  cp "$run/kubeconfig-admin" "$run/kubeconfig"
  wait_until "kube-apiserver /readyz" 120 kube-apiserver kc get --raw /readyz
  spawn kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$run/kubeconfig-kcm" --authentication-kubeconfig "$run/kubeconfig-kcm" \
    --authorization-kubeconfig "$run/kubeconfig-kcm" \
    --bind-address 127.0.0.1 --secure-port "$(cat "$run/ports/kcm")" \
    --service-account-private-key-file "$c/sa.key" --root-ca-file "$c/ca.crt" \
    --use-service-account-credentials=true --leader-elect=false \
    --service-cluster-ip-range "$svc_cidr" --allocate-node-cidrs=false \
    --profiling=false
  spawn kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$run/kubeconfig-scheduler" --authentication-kubeconfig "$run/kubeconfig-scheduler" \
    --authorization-kubeconfig "$run/kubeconfig-scheduler" \
    --bind-address 127.0.0.1 --secure-port "$(cat "$run/ports/scheduler")" --leader-elect=false --profiling=false
}

start_node() {
  mkdir -p "$run/kubelet"
  cat >"$run/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $(cat "$run/ports/kubelet")
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(cat "$run/ports/kubelet-healthz")
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$run/certs/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: "unix://$sock"
failSwapOn: false
resolvConf: ""
clusterDNS: ["$gw"]
clusterDomain: cluster.local
# A shared 2-core test machine: never evict for pressure, never garbage-collect the imported
# images (they cannot be pulled again).
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
maxPods: 60
EOF
  spawn kubelet "$bin/kubelet" --config "$run/kubelet/config.yaml" --kubeconfig "$run/kubeconfig-node" \
    --hostname-override "$node_name" --root-dir "$run/kubelet/root" --cert-dir "$run/kubelet/pki" --v=1
  mkdir -p "$run/proxy"
  cat >"$run/proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: "$run/kubeconfig-proxy"}
hostnameOverride: "$node_name"
clusterCIDR: "$pod_cidr"
bindAddress: 127.0.0.1
healthzBindAddress: "127.0.0.1:$(cat "$run/ports/proxy-healthz")"
metricsBindAddress: "127.0.0.1:$(cat "$run/ports/proxy-metrics")"
# NodePorts only on the bridge address (loopback NodePorts would need route_localnet).
nodePortAddresses: ["$gw/32"]
# Leave the conntrack table sizes as the machine has them.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  spawn kube-proxy "$bin/kube-proxy" --config "$run/proxy/config.yaml"
}

start_dns_and_storage() {
  # CoreDNS reads Services, EndpointSlices, Pods and Namespaces; nothing else.
  kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "kraftkeeper:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kraftkeeper:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kraftkeeper:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kk-coredns}]
EOF
  mkdir -p "$run/coredns"
  cat >"$run/coredns/Corefile" <<EOF
.:53 {
    bind $gw
    errors
    health 127.0.0.1:$(cat "$run/ports/coredns-health")
    ready 127.0.0.1:$(cat "$run/ports/coredns-ready")
    cache 5
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $run/kubeconfig-coredns kk
        pods insecure
        ttl 5
    }
}
EOF
  spawn coredns "$bin/coredns" -conf "$run/coredns/Corefile"
  local i docs=""
  mkdir -p "$run/pv"
  for i in $(seq -w 1 "$pv_count"); do
    mkdir -p "$run/pv/pv$i"; chmod 0755 "$run/pv/pv$i"
    docs="$docs
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: kk-local-pv$i, labels: {kraftkeeper.io/test-node: local}}
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: kk-local
  local: {path: $run/pv/pv$i}
  nodeAffinity:
    required:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [\"$node_name\"]}]}]"
  done
  kc apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: kk-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
$docs
EOF
}

node_ready() {
  [ "$(kc get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
default_sa() { kc -n default get serviceaccount default; }
dns_ready() { curl -sf "http://127.0.0.1:$(cat "$run/ports/coredns-ready")/ready"; }

up() {
  if alive kube-apiserver && alive kubelet; then
    log "already running under $run"; echo "$run/kubeconfig"; return 0
  fi
  [ -e "$run/pids" ] && { log "a previous run left $run behind: cleaning it up first"; down; }
  check_all >/dev/null || { check_all >&2 || true; die "run '$0 install' first"; }
  [ "$(id -u)" = 0 ] || die "must run as root (kubelet, containerd, iptables, mounts)"
  local start; start="$(date +%s)"
  mkdir -p "$run/pids" "$run/logs"
  save_host_state
  make_certs
  setup_network
  export PATH="$bin:$PATH"
  start_containerd
  start_control_plane
  start_node
  wait_until "node $node_name Ready" 120 kubelet node_ready
  start_dns_and_storage
  wait_until "CoreDNS ready" 60 coredns dns_ready
  wait_until "ServiceAccount default/default" 60 kube-controller-manager default_sa
  log "cluster up in $(( $(date +%s) - start )) s; KUBECONFIG=$run/kubeconfig"
  echo "$run/kubeconfig"
}

stop_group() {  # stop_group NAME... : TERM to all of them at once, KILL what still runs after 15 s
  local name pid pids=() i
  for name in "$@"; do
    [ -f "$run/pids/$name" ] || continue
    pid="$(cat "$run/pids/$name")"
    if kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  [ "${#pids[@]}" -gt 0 ] || { for name in "$@"; do rm -f "$run/pids/$name"; done; return 0; }
  local left
  for i in $(seq 1 60); do
    left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.25
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for name in "$@"; do rm -f "$run/pids/$name"; done
}

stop_containers() {
  [ -S "$sock" ] || return 0
  local c=(ctr --address "$sock" -n k8s.io) id i
  for id in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  for i in $(seq 1 20); do
    [ -z "$("${c[@]}" tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING"')" ] && break
    sleep 0.5
  done
  for id in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks delete -f "$id" >/dev/null 2>&1 || true; done
  for id in $("${c[@]}" containers ls -q 2>/dev/null); do "${c[@]}" containers delete "$id" >/dev/null 2>&1 || true; done
}

kill_shims() {  # the runc shims of our containerd outlive it; find them by its socket, kill by PID
  local p
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- "-address $sock"; then kill -9 "${p#/proc/}" 2>/dev/null || true; fi
  done
}

unmount_under() {  # unmount every mount point below $1, deepest first
  local m
  awk -v d="$1" '{ gsub(/\\040/, " ", $5); if (index($5, d "/") == 1 || $5 == d) print $5 }' /proc/self/mountinfo |
    sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done || true
}

clean_iptables() {
  local ipt t rule ch
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null 2>&1 || continue
    for t in filter nat mangle; do
      "$ipt" -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j (KUBE-|KK-)' | grep -vE '^-A (KUBE-|KK-)' |
        while read -r rule; do
          # shellcheck disable=SC2086
          eval "$ipt -t $t -D ${rule#-A }" 2>/dev/null || true
        done || true
      for ch in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && ($2 ~ /^KUBE-/ || $2 ~ /^KK-/) {print $2}'); do
        "$ipt" -t "$t" -F "$ch" 2>/dev/null || true
      done
      for ch in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && ($2 ~ /^KUBE-/ || $2 ~ /^KK-/) {print $2}'); do
        "$ipt" -t "$t" -X "$ch" 2>/dev/null || true
      done
    done
  done
}

down() {
  [ -d "$run" ] || { log "not running (no $run)"; return 0; }
  local name
  stop_group coredns kube-proxy kubelet kube-scheduler kube-controller-manager
  stop_containers
  stop_group containerd
  kill_shims
  stop_group kube-apiserver etcd
  # The pods' network namespaces (the CRI plugin names them cni-*) that were not there before.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do
    grep -qx "$ns" "$run/saved/netns" 2>/dev/null || ip netns delete "$ns" 2>/dev/null || true
  done
  unmount_under "$run"; unmount_under "$cstate"
  local cg
  for cg in /sys/fs/cgroup/*/kubepods; do
    [ -d "$cg" ] || continue
    grep -qx "$cg" "$run/saved/cgroups" 2>/dev/null && continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  clean_iptables
  local tbl
  command -v nft >/dev/null 2>&1 && nft list tables 2>/dev/null | while read -r _ fam tname; do
    case "$tname" in *kube*) grep -qx "table $fam $tname" "$run/saved/nft-tables" 2>/dev/null || nft delete table "$fam" "$tname" 2>/dev/null || true ;; esac
  done || true
  ip link del "$bridge" 2>/dev/null || true
  if [ -f "$run/saved/sysctls" ]; then
    while IFS= read -r tbl; do sysctl -qw "$tbl" 2>/dev/null || true; done <"$run/saved/sysctls"
  fi
  [ -f "$run/saved/var-log-pods-existed" ] || rm -rf /var/log/pods /var/log/containers
  rm -rf "$run.logs"; [ -d "$run/logs" ] && cp -r "$run/logs" "$run.logs"
  if awk -v d="$run" 'index($5, d "/") == 1' /proc/self/mountinfo | grep -q .; then
    die "mounts remain under $run after unmounting; left it in place"
  fi
  rm -rf --one-file-system "$run" "$cstate"
  log "cluster stopped and cleaned up (logs of this run: $run.logs)"
}

status() {
  local ok=0 name
  for name in $components; do
    if alive "$name"; then echo "$name: running (pid $(cat "$run/pids/$name"))"; else echo "$name: not running"; ok=1; fi
  done
  if [ "$ok" = 0 ] && node_ready; then echo "node $node_name: Ready"; else echo "node $node_name: not Ready"; ok=1; fi
  return "$ok"
}

load_image() {
  local image="$1"
  [ -S "$sock" ] || die "the node's containerd is not running ($0 up)"
  local docker_bin; docker_bin="$( [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker )"
  "$docker_bin" image inspect "$image" >/dev/null 2>&1 || die "no local Docker image $image (scripts/build-image.sh)"
  log "importing $image into the node's containerd"
  "$docker_bin" save "$image" | ctr --address "$sock" -n k8s.io images import - >/dev/null
}

# One `up` or `down` at a time on this machine. Two callers at once (two test runs, a test run and
# an `up` by hand) wrote their ports into the same files and started two etcds and two API
# servers on one data directory, and one of them failed "address already in use". The second
# caller now waits, then finds the cluster running (or gone). Components never hold the lock
# (spawn closes its descriptor), so a running cluster does not block a later `up` or `down`.
exclusive() {
  mkdir -p "$(dirname "$run")"
  exec 9>"$run.lock"
  flock -w 900 9 || die "another '$0 up' or 'down' has held $run.lock for 15 minutes"
}

case "${1:-}" in
  install) install_all ;;
  check) rc=0; check_all || rc=$?; exit "$rc" ;;  # a nonzero answer is not a failure of the script
  up) exclusive; up ;;
  down) exclusive; down ;;
  status) rc=0; status || rc=$?; exit "$rc" ;;
  load-image) [ -n "${2:-}" ] || die "usage: $0 load-image IMAGE"; load_image "$2" ;;
  env)
    echo "export PATH='$bin':\"\$PATH\""
    alive kube-apiserver && echo "export KUBECONFIG='$run/kubeconfig'"
    ;;
  *) echo "usage: $0 install|check|up|down|status|load-image IMAGE|env" >&2; exit 2 ;;
esac
