#!/bin/bash
# Entrypoint of the Kafka controller image: formats an empty volume once, then runs the controller.
#
# Inputs (environment):
#   POD_NAME               the StatefulSet pod's name; node.id is its ordinal (kafka-2 -> 2)
#   KAFKA_ADVERTISED_HOST  this controller's stable name; "{pod}" is replaced by POD_NAME
#   KAFKA_CLUSTER_ID       the cluster id every controller is formatted with
#   KAFKA_FORMAT_MODE      "bootstrap" while the StatefulSet is first created, "join" after that
#   KAFKA_QUORUM_FORMED    set (to when) once the controllers formed their quorum: an empty volume
#                          then joins even if KAFKA_FORMAT_MODE still says bootstrap (a manifest
#                          re-applied after the formation sets that back; this marker is not in it)
#   KAFKA_INITIAL_CONTROLLERS  id@host:port:directory-id,... (bootstrap only)
#   KAFKA_JAAS_FILE        file holding the controller listener's PLAIN JAAS line (optional)
#   KAFKA_HEAP_OPTS        JVM heap flags (default -Xmx256m -Xms64m)
# Files: /etc/kafka/config/server.properties (everything but node.id and advertised.listeners).
#
# The format decision (KIP-853):
#   * a volume that holds meta.properties is never formatted again: the controller starts on it;
#   * a volume that holds anything else but no meta.properties is refused (exit 2): it is not ours
#     to wipe;
#   * an empty volume is formatted with --initial-controllers only in bootstrap mode (the
#     directory id is the one pre-assigned to this node id in the initial voter set); in join
#     mode it is formatted with --no-initial-controllers, so Kafka draws a NEW directory id and
#     the controller comes back as an observer that the operator promotes (AddRaftVoter) after
#     removing its old directory id (RemoveRaftVoter). Re-using the old directory id on an empty
#     log would let a voter forget what it had acknowledged.
# The format runs into a sibling directory that is renamed into place once complete, so a
# controller killed half-way leaves no half-formatted log directory behind.
set -euo pipefail

say() { echo "kafka-entrypoint: $(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) $*"; }
die() { echo "kafka-entrypoint: $*" >&2; exit 2; }

# The paths are overridable for tests only (tests/kafka/test_kafka_image_entrypoint.py).
root="${KAFKA_VOLUME:-/var/lib/kafka}"
data="$root/data"
staging="$root/.formatting"
template="${KAFKA_CONFIG_TEMPLATE:-/etc/kafka/config/server.properties}"
config="${KAFKA_CONFIG_OUT:-/tmp/server.properties}"
libs='/opt/kafka/libs/*'
heap="${KAFKA_HEAP_OPTS:--Xmx256m -Xms64m}"
# DNS answers cached for 1 s, failures not at all (the JVM's defaults: 30 s and 10 s). A replaced
# controller pod comes back under its old name with a new IP: with the default cache the leader
# keeps connecting to the old address for up to 30 s, and AddRaftVoter, which needs the leader to
# reach the new controller (an ApiVersions request to its listener, KIP-853), fails for as long.
# A controller resolves a peer only when it (re)connects, so the short cache costs little.
# shellcheck disable=SC2206
jvm=($heap -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
     -Dsun.net.inetaddr.ttl=1 -Dsun.net.inetaddr.negative.ttl=0
     -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties)

[ -n "${POD_NAME:-}" ] || die "POD_NAME is not set (use the downward API: metadata.name)"
ordinal="${POD_NAME##*-}"
[[ "$ordinal" =~ ^[0-9]+$ ]] || die "POD_NAME $POD_NAME does not end in -<ordinal>"
node_id=$((10#$ordinal))
[ -n "${KAFKA_CLUSTER_ID:-}" ] || die "KAFKA_CLUSTER_ID is not set"
[ -f "$template" ] || die "$template is missing (mount the controller's ConfigMap there)"
host="${KAFKA_ADVERTISED_HOST:-$POD_NAME}"
host="${host//\{pod\}/$POD_NAME}"
port="${KAFKA_PORT:-9093}"

write_config() {  # write_config LOG_DIR
  {
    cat "$template"
    echo
    echo "node.id=$node_id"
    echo "advertised.listeners=CONTROLLER://$host:$port"
    echo "log.dirs=$1"
    echo "metadata.log.dir=$1"
    if [ -n "${KAFKA_JAAS_FILE:-}" ]; then
      [ -r "$KAFKA_JAAS_FILE" ] || die "KAFKA_JAAS_FILE $KAFKA_JAAS_FILE is not readable"
      echo "listener.name.controller.plain.sasl.jaas.config=$(tr -d '\n' <"$KAFKA_JAAS_FILE")"
    fi
  } >"$config"
  chmod 0600 "$config"
}

if [ -f "$data/meta.properties" ]; then
  say "$data is formatted ($(grep '^directory.id=' "$data/meta.properties")); starting"
elif [ -e "$data" ] && [ -n "$(ls -A "$data")" ]; then
  die "$data holds files but no meta.properties: refusing to format a volume that is not empty"
else
  rm -rf "$staging" "$data"
  write_config "$staging"
  mode="${KAFKA_FORMAT_MODE:-join}"
  case "$mode" in bootstrap | join) ;; *) die "KAFKA_FORMAT_MODE must be bootstrap or join, not ${mode}" ;; esac
  if [ "$mode" = bootstrap ] && [ -n "${KAFKA_QUORUM_FORMED:-}" ]; then
    # Bootstrapping now would give this empty volume a bootstrap voter's directory id: the one
    # thing KIP-853's directory ids exist to prevent.
    say "the quorum formed at $KAFKA_QUORUM_FORMED: joining with a new directory id, not bootstrapping"
    mode=join
  fi
  case "$mode" in
    bootstrap)
      [ -n "${KAFKA_INITIAL_CONTROLLERS:-}" ] || die "bootstrap mode needs KAFKA_INITIAL_CONTROLLERS"
      how=(--initial-controllers "$KAFKA_INITIAL_CONTROLLERS") ;;
    join) how=(--no-initial-controllers) ;;
  esac
  say "empty volume, formatting node $node_id ($mode)"
  java "${jvm[@]}" -cp "$libs" kafka.tools.StorageTool format --config "$config" \
    --cluster-id "$KAFKA_CLUSTER_ID" "${how[@]}"
  [ -f "$staging/meta.properties" ] || die "kafka-storage format left no meta.properties"
  mv "$staging" "$data"
  say "formatted, $(grep '^directory.id=' "$data/meta.properties")"
fi

write_config "$data"
exec java "${jvm[@]}" -cp "$libs" kafka.Kafka "$config"
