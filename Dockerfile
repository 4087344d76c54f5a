# One image for the quorum node (`kraftkeeper start ...`) and the operator
# (`kraftkeeper operator run`). Built by scripts/build-image.sh, which first builds every wheel on
# the host into dist/wheels (the build itself never reaches a package index):
#   builder: builds the kraftkeeper wheel from the sources against those wheels only;
#   final:   installs the wheels with --no-index into a venv, runs as a non-root user and works
#            with a read-only root filesystem (HOME, caches and data on the /data and /tmp volumes).
# Needs BuildKit (the default builder of current Docker; DOCKER_BUILDKIT=1 on Docker 20.10).
# BASE_IMAGE must provide python3 (3.11+) with the venv module: python:3.11-slim, or the local
# Debian bookworm base that scripts/build-image.sh makes with debootstrap.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
WORKDIR /src
COPY dist/wheels/ /wheels/
COPY pyproject.toml README.md ./
COPY quorum/ quorum/
COPY operator/ operator/
COPY reports/ reports/
# setuptools/wheel come from /wheels too (build-image.sh downloads them): no index is reachable.
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --no-index --find-links /wheels --upgrade setuptools wheel \
 && /opt/build/bin/pip wheel --no-cache-dir --no-index --no-build-isolation --no-deps \
      --find-links /wheels -w /out . \
 && find /wheels -name '*.whl' ! -name 'kraftkeeper-*' ! -name 'setuptools-*' ! -name 'wheel-*' \
      -exec cp {} /out/ \;

FROM ${BASE_IMAGE}
ARG UID=10001
LABEL org.opencontainers.image.title="kraftkeeper" \
      org.opencontainers.image.description="KRaft-style quorum with KIP-856 disk-failure recovery, and its operator" \
      org.opencontainers.image.licenses="Apache-2.0"
# Everything that writes goes to /data (node data, event logs) or /tmp; both are volumes in
# Kubernetes (readOnlyRootFilesystem: true), and the directories exist for plain `docker run`.
ENV HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/kraftkeeper/bin:$PATH \
    KRAFTKEEPER_KAFKA_LIBS=/opt/kraftkeeper-kafka
# Kafka's message schemas only (AddRaftVoter / RemoveRaftVoter for `spec.kafka` quorums), written
# by scripts/build-image.sh from the cached kafka-clients jar: no Kafka code, no JVM.
COPY dist/kafka/ /opt/kraftkeeper-kafka/
# The wheels are bind-mounted from the builder (BuildKit), so they never become an image layer.
RUN --mount=type=bind,from=builder,source=/out,target=/mnt/wheels \
    python3 -m venv /opt/kraftkeeper \
 && /opt/kraftkeeper/bin/pip install --no-cache-dir --no-index --find-links /mnt/wheels "kraftkeeper[operator]" \
 && /opt/kraftkeeper/bin/pip uninstall -y -q pip \
 && groupadd --gid "${UID}" kraftkeeper \
 && useradd --uid "${UID}" --gid "${UID}" --no-create-home --home-dir /tmp --shell /usr/sbin/nologin kraftkeeper \
 && mkdir -p /data \
 && chown "${UID}:${UID}" /data \
 && chmod 1777 /tmp
USER ${UID}:${UID}
WORKDIR /data
VOLUME ["/data"]
EXPOSE 9093 9090
ENTRYPOINT ["kraftkeeper"]
CMD ["--help"]
