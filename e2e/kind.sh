#!/usr/bin/env bash
# End-to-end disk-failure recovery on a kind cluster (needs Docker, kind, kubectl and helm, and a
# machine that can pull kind's node image: NOT runnable on the build machines, see README.md).
#
#   e2e/kind.sh [--keep]
#
# 1. builds the image (scripts/build-image.sh) and loads it into a new kind cluster;
# 2. helm-installs the chart (namespace-scoped RBAC: it watches the release namespace) and applies
#    e2e/sample.yaml (a 3-voter KRaftQuorum with TLS on) and e2e/client.yaml (a client pod);
# 3. waits for a leader, then deletes replica 2's pod together with its PVC (a lost disk);
# 4. waits for the operator's automatic recovery (status.recoveries[-1].result == Succeeded) and
#    prints its timings (status.recoveries[-1].phaseSeconds) and the recovery event log.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cluster="${KK_KIND_CLUSTER:-kraftkeeper-e2e}"
ns="${KK_E2E_NAMESPACE:-kraftkeeper}"
image="${KK_IMAGE:-kraftkeeper:dev}"
timeout_s="${KK_E2E_TIMEOUT:-900}"
keep=0; [ "${1:-}" = "--keep" ] && keep=1

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "e2e: $tool is required" >&2; exit 1; }
done
log() { printf '==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
cleanup() { if [ "$keep" = 0 ]; then kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT

# Polls `cmd` every 2 s until it succeeds, for at most `secs`.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "e2e: timed out waiting for $what" >&2; return 1; }
    sleep 2
  done
}

log "building $image"
KK_IMAGE="$image" "$here/scripts/build-image.sh" build
log "creating kind cluster $cluster"
kind create cluster --name "$cluster" --wait 120s
kind load docker-image --name "$cluster" "$image"

log "installing the chart"
helm install kraftkeeper "$here/charts/kraftkeeper" --namespace "$ns" --create-namespace \
  --set image.repository="${image%%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
  --set operator.persistence.enabled=true --wait --timeout 5m

log "creating the quorum (e2e/sample.yaml)"
kubectl -n "$ns" apply -f "$here/e2e/sample.yaml"
leader() { kubectl -n "$ns" get kq demo -o jsonpath='{.status.leaderId}'; }
wait_for "a leader" "$timeout_s" sh -c "[ \"\$(kubectl -n $ns get kq demo -o jsonpath='{.status.leaderId}')\" -ge 0 ]"
log "leader is $(leader); starting a client pod with the quorum's client credential (TLS is on)"
wait_for "Secret demo-client" "$timeout_s" kubectl -n "$ns" get secret demo-client
sed "s|image: kraftkeeper:dev|image: $image|" "$here/e2e/client.yaml" | kubectl -n "$ns" apply -f -
kubectl -n "$ns" wait --for=condition=Ready pod/client --timeout=300s
log "writing a key through the client Service over TLS"
kubectl -n "$ns" exec client -- kraftkeeper kv put --bootstrap "demo.$ns.svc:9093" e2e-key before-recovery

before="$(kubectl -n "$ns" get kq demo -o jsonpath='{.status.recoveries}' | python3 -c 'import json,sys; d=sys.stdin.read(); print(len(json.loads(d)) if d.strip() else 0)')"
victim=demo-1
pvc="$(kubectl -n "$ns" get pod "$victim" -o jsonpath='{.spec.volumes[?(@.persistentVolumeClaim)].persistentVolumeClaim.claimName}')"
log "deleting pod $victim together with its PVC $pvc (a lost disk)"
kubectl -n "$ns" delete pvc "$pvc" --wait=false
kubectl -n "$ns" delete pod "$victim" --wait=false
t0=$(date +%s)

done_recovery() {
  kubectl -n "$ns" get kq demo -o json | python3 -c '
import json, sys
before = int(sys.argv[1])
recs = json.load(sys.stdin).get("status", {}).get("recoveries", [])
sys.exit(0 if len(recs) > before and recs[-1].get("result") == "Succeeded" else 1)' "$before"
}
wait_for "automatic recovery" "$timeout_s" done_recovery
log "recovered in $(( $(date +%s) - t0 )) s (wall clock, seen from outside)"

echo "--- last recovery (status.recoveries[-1]) ---"
kubectl -n "$ns" get kq demo -o json | python3 -c '
import json, sys
r = json.load(sys.stdin)["status"]["recoveries"][-1]
print(json.dumps(r, indent=2))
for phase, secs in (r.get("phaseSeconds") or {}).items():
    print(f"{phase:>16}: {secs:8.2f} s")'
echo "--- the key written before the recovery ---"
kubectl -n "$ns" exec client -- kraftkeeper kv get --bootstrap "demo.$ns.svc:9093" e2e-key
echo "--- recovery event log ---"
kubectl -n "$ns" exec deploy/kraftkeeper -- sh -c 'cat /data/events/*.jsonl' || true
