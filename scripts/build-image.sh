#!/usr/bin/env bash
# Builds the kraftkeeper image (Dockerfile) on a machine whose Docker engine cannot pull images.
#
#   scripts/build-image.sh [build]   engine + base image + wheels + `docker build` (default)
#   scripts/build-image.sh engine    install Debian's docker.io and start dockerd if not running
#   scripts/build-image.sh base      only the base image
#   scripts/build-image.sh check     exit 0 when the engine runs and the base image exists
#   scripts/build-image.sh jre-base  only the JRE base image (bookworm + openjdk-17-jre-headless)
#   scripts/build-image.sh kafka     the Kafka controller image $KK_KAFKA_IMAGE (default
#                                    kraftkeeper-kafka:4.4.0): JRE base + the cached Kafka jars +
#                                    images/kafka-controller (entrypoint that formats on first start)
#   scripts/build-image.sh report    the report job's image $KK_REPORT_IMAGE (default
#                                    kraftkeeper-report:<version>): a bookworm base with python3 +
#                                    openjdk-17-jre-headless (cached tarball) + kraftkeeper[spark]
#                                    wheels built on the host (images/report/Dockerfile)
#
# Steps (each cached):
#   1. Debian's docker.io; dockerd is started in the background if `docker info` fails
#      (log: $KK_CACHE/logs/dockerd.log).
#   2. Base image $KK_BASE_IMAGE (default kraftkeeper-base:bookworm): Debian bookworm from
#      `debootstrap --variant=minbase` with python3 + python3-venv, imported with `docker import`.
#      The root filesystem tarball is kept in $KK_CACHE/images/ so a wiped engine re-imports it
#      in seconds. The Debian mirror is the one apt already uses (or $KK_DEBIAN_MIRROR).
#   3. Wheels for kraftkeeper[operator] and every dependency, plus setuptools/wheel for the
#      in-image build, into dist/wheels with the host's pip (the image build is offline).
#   4. Kafka's message schemas (common/message/*.json of the kafka-clients jar that
#      scripts/kafka.sh caches, fetched if missing) into dist/kafka as a 0.5 MB jar, so the
#      operator can drive AddRaftVoter / RemoveRaftVoter for `spec.kafka` quorums with nothing
#      mounted (quorum/kafka/schemas.py).
#   5. docker build --build-arg BASE_IMAGE=<base> -t $KK_IMAGE (default kraftkeeper:dev, also
#      tagged kraftkeeper:<version>, the chart's default tag).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${KK_CACHE:-$HOME/.cache/kraftkeeper}"
base_image="${KK_BASE_IMAGE:-kraftkeeper-base:bookworm}"
image="${KK_IMAGE:-kraftkeeper:dev}"
python="${PYTHON:-$here/.venv/bin/python}"
# Debian's client matches Debian's daemon; another client on PATH may speak a newer API.
docker_bin="${DOCKER:-$( [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker )}"

log() { printf '==> %s\n' "$*" >&2; }
docker() { "$docker_bin" "$@"; }

engine_running() { docker info >/dev/null 2>&1; }

ensure_engine() {
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing Debian's docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io >/dev/null
    docker_bin=/usr/bin/docker
  fi
  engine_running && return 0
  mkdir -p "$cache/logs"
  log "starting dockerd (log: $cache/logs/dockerd.log)"
  # dockerd outlives this script: it must not inherit our open files beyond stdio, above all a
  # lock the caller holds (`flock /tmp/kk-kubelet.lock ...` passes it as fd 3; a dockerd holding it
  # would keep every other user of the single-node cluster waiting for as long as it runs).
  (
    for fd in /proc/self/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec nohup dockerd >"$cache/logs/dockerd.log" 2>&1 </dev/null
  ) &
  for _ in $(seq 1 60); do
    engine_running && return 0
    sleep 1
  done
  echo "build-image: dockerd did not start (see $cache/logs/dockerd.log)" >&2
  tail -n 20 "$cache/logs/dockerd.log" >&2 || true
  return 1
}

debian_mirror() {
  if [ -n "${KK_DEBIAN_MIRROR:-}" ]; then echo "$KK_DEBIAN_MIRROR"; return; fi
  local m=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    m="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m="$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list)"
  fi
  [ -n "$m" ] || { echo "build-image: no Debian mirror in apt's sources; set KK_DEBIAN_MIRROR" >&2; return 1; }
  echo "$m"
}

# debootstrap_image IMAGE TARBALL PACKAGES: Debian bookworm from `debootstrap --variant=minbase`
# with the comma-separated PACKAGES, its root filesystem cached as TARBALL (a wiped engine
# re-imports it in seconds), imported as IMAGE; nothing done when IMAGE exists.
debootstrap_image() {
  local image="$1" tarball="$2" packages="$3"
  if docker image inspect "$image" >/dev/null 2>&1; then return 0; fi
  if [ ! -f "$tarball" ]; then
    command -v debootstrap >/dev/null 2>&1 || {
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    }
    local root mirror logfile
    root="$(mktemp -d)"
    mirror="$(debian_mirror)"
    logfile="$cache/logs/debootstrap-$(basename "$tarball" .tar).log"
    mkdir -p "$cache/logs"
    log "debootstrap bookworm (minbase + $packages) into $root"
    debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" \
      >"$logfile" 2>&1 || { tail -n 20 "$logfile" >&2; return 1; }
    # Nothing installs packages at run time: drop apt's lists, caches and docs to keep it small.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
      "$root"/usr/share/man/* "$root"/usr/share/locale/*
    mkdir -p "$cache/images"
    tar -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  log "docker import $tarball as $image"
  docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
}

ensure_base() {
  debootstrap_image "$base_image" "$cache/images/base-bookworm.tar" python3,python3-venv
}

# The JRE base image $KK_JRE_BASE_IMAGE (default kraftkeeper-jre:bookworm): Debian bookworm with
# openjdk-17-jre-headless, for images that run a JVM (the Kafka controller image; a Spark image
# could start from it too), cached as $KK_CACHE/images/jre-bookworm.tar.
jre_base_image="${KK_JRE_BASE_IMAGE:-kraftkeeper-jre:bookworm}"

ensure_jre_base() {
  debootstrap_image "$jre_base_image" "$cache/images/jre-bookworm.tar" openjdk-17-jre-headless,ca-certificates-java
}

build_wheels() {
  log "building wheels into dist/wheels"
  mkdir -p "$here/dist/wheels"
  rm -f "$here"/dist/wheels/kraftkeeper-*.whl
  # Built from a copy of what the wheel holds, not in the checkout: setuptools' in-tree build/
  # keeps files of modules since moved or deleted (they would ship in the wheel), and is shared
  # with any other build of the checkout running at the same time.
  local stage
  stage="$(mktemp -d)"
  tar -C "$here" --exclude=__pycache__ --exclude='*.pyc' -cf - pyproject.toml README.md quorum operator reports demos \
    | tar -C "$stage" -xf -
  "$python" -m pip wheel -q "$stage[operator]" -w "$here/dist/wheels"
  rm -rf "$stage"
  "$python" -m pip download -q --only-binary=:all: -d "$here/dist/wheels" "setuptools>=68" wheel
}

kafka_schemas() {
  local jar
  jar="$(ls "$cache"/kafka-*/libs/kafka-clients-*.jar 2>/dev/null | sort -r | head -n1 || true)"
  if [ -z "$jar" ]; then
    log "fetching the Kafka jars for their message schemas (scripts/kafka.sh install)"
    "$here/scripts/kafka.sh" install >/dev/null
    jar="$(ls "$cache"/kafka-*/libs/kafka-clients-*.jar | sort -r | head -n1)"
  fi
  rm -rf "$here/dist/kafka"
  local name
  name="$(basename "$jar" .jar)-schemas.jar"
  (cd "$here" && "$python" -m quorum.kafka.schemas write-jar "$jar" "dist/kafka/$name") >&2
}

build_image() {
  local version
  version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/pyproject.toml" | head -n1)"
  log "docker build $image (base $base_image)"
  # BuildKit: the Dockerfile bind-mounts the builder's wheels instead of copying them in.
  DOCKER_BUILDKIT=1 docker build -q --build-arg "BASE_IMAGE=$base_image" -t "$image" -t "kraftkeeper:$version" "$here" >/dev/null
  log "built $image"
}

kafka_image="${KK_KAFKA_IMAGE:-kraftkeeper-kafka:4.4.0}"

build_kafka_image() {
  local libs="$cache/kafka-${KAFKA_VERSION:-4.4.0}/libs"
  if [ ! -f "$libs/.complete" ]; then
    log "fetching the Kafka jars (scripts/kafka.sh install)"
    "$here/scripts/kafka.sh" install >/dev/null
  fi
  # The build context: the image's own files plus the jars (hard links where the cache shares
  # the file system, so the context costs no copy).
  local ctx="$here/dist/kafka-controller"
  rm -rf "$ctx"
  mkdir -p "$ctx/libs"
  cp "$here"/images/kafka-controller/{Dockerfile,entrypoint.sh,log4j2.properties} "$ctx/"
  cp -l "$libs"/*.jar "$ctx/libs/" 2>/dev/null || cp "$libs"/*.jar "$ctx/libs/"
  log "docker build $kafka_image (base $jre_base_image)"
  DOCKER_BUILDKIT=1 docker build -q --build-arg "BASE_IMAGE=$jre_base_image" -t "$kafka_image" "$ctx" >/dev/null
  log "built $kafka_image"
}

# The report job's base $KK_REPORT_BASE_IMAGE: bookworm with Python and a JRE (PySpark needs both),
# cached as $KK_CACHE/images/report-bookworm.tar.
report_base_image="${KK_REPORT_BASE_IMAGE:-kraftkeeper-report-base:bookworm}"

build_report_image() {
  debootstrap_image "$report_base_image" "$cache/images/report-bookworm.tar" \
    python3,python3-venv,openjdk-17-jre-headless,ca-certificates-java
  local version ctx stage
  version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/pyproject.toml" | head -n1)"
  local report_image="${KK_REPORT_IMAGE:-kraftkeeper-report:$version}"
  ctx="$here/dist/report-image"
  mkdir -p "$ctx/wheels" "$ctx/app"
  cp "$here/images/report/Dockerfile" "$ctx/"
  rm -f "$ctx"/wheels/kraftkeeper-*.whl "$ctx"/app/*.whl
  # As build_wheels: from a copy of the sources. The dependency wheels stay in the context
  # between runs.
  stage="$(mktemp -d)"
  tar -C "$here" --exclude=__pycache__ --exclude='*.pyc' -cf - pyproject.toml README.md quorum operator reports demos \
    | tar -C "$stage" -xf -
  # Two layers: the dependencies (PySpark's jars most of the image) pinned by
  # wheels/requirements.txt, then kraftkeeper's own wheel from app/. A change to our code leaves
  # wheels/ as it was, so docker reuses the dependency layer (a layer's cache key is the content
  # it bind-mounts) and reinstalls one small wheel; the dependencies are resolved again only when
  # pyproject.toml changes.
  local deps_key
  deps_key="$(sha256sum "$here/pyproject.toml" | cut -c1-16)"
  if [ -f "$ctx/wheels/requirements.txt" ] && [ "$(cat "$ctx/deps.key" 2>/dev/null)" = "$deps_key" ]; then
    log "building the kraftkeeper wheel into $ctx/app (dependencies as pinned in wheels/requirements.txt)"
    "$python" -m pip wheel -q --no-deps "$stage" -w "$ctx/app"
  else
    log "building kraftkeeper[spark] wheels into $ctx/wheels"
    "$python" -m pip wheel -q "$stage[spark]" -w "$ctx/wheels"
    mv "$ctx"/wheels/kraftkeeper-*.whl "$ctx/app/"
    "$python" - "$ctx" <<'PY'
import json, subprocess, sys
from pathlib import Path
ctx = Path(sys.argv[1])
app = next((ctx / "app").glob("kraftkeeper-*.whl"))
out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                      "--no-index", "--find-links", str(ctx / "wheels"), "--report", "-",
                      f"kraftkeeper[spark] @ {app.as_uri()}"], check=True, capture_output=True, text=True)
pins = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in json.loads(out.stdout)["install"]
              if i["metadata"]["name"] != "kraftkeeper")
new = "".join(p + "\n" for p in pins)
req = ctx / "wheels" / "requirements.txt"
if not req.exists() or req.read_text() != new:  # rewritten only on a change: its bytes are a cache key
    req.write_text(new)
PY
    echo "$deps_key" > "$ctx/deps.key"
  fi
  rm -rf "$stage"
  log "docker build $report_image (base $report_base_image)"
  DOCKER_BUILDKIT=1 docker build -q --build-arg "BASE_IMAGE=$report_base_image" -t "$report_image" "$ctx" >/dev/null
  log "built $report_image"
}

case "${1:-build}" in
  engine) ensure_engine ;;
  base) ensure_engine; ensure_base ;;
  check)
    engine_running || { echo "docker engine not running"; exit 1; }
    docker image inspect "$base_image" >/dev/null 2>&1 || { echo "base image $base_image missing"; exit 1; }
    echo "ok: engine running, $base_image present"
    ;;
  build) ensure_engine; ensure_base; build_wheels; kafka_schemas; build_image ;;
  jre-base) ensure_engine; ensure_jre_base ;;
  kafka) ensure_engine; ensure_jre_base; build_kafka_image ;;
  report) ensure_engine; build_report_image ;;
  *) echo "usage: $0 [build|engine|base|jre-base|kafka|report|check]" >&2; exit 2 ;;
esac
