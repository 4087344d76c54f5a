"""A KRaftQuorum that points at an existing Apache Kafka 4.x controller quorum (``spec.kafka``).

The operator then runs no engine: no StatefulSet, Services, PodDisruptionBudget, NetworkPolicy or
TLS objects. It only repairs membership (KIP-853 AddRaftVoter / RemoveRaftVoter) with the same
:class:`~..controller.RecoveryController` as for our own quorums, through
:class:`~.backend.KafkaQuorum` as its ``QuorumApi``; ``status`` (voters with directory ids as
canonical UUIDs, leader, epoch, conditions Available / Degraded / Recovering / QuorumLost), the
Kubernetes Events and the event log are the same.

* handlers.py's create / update / resume handler hands such a resource to
  :func:`~.kafkaspec.reconcile_kafka` (validation; a bad spec is ``status.phase=Failed`` with an
  ``InvalidSpec`` condition naming the field, and a Warning Event); the CRD schema refuses most bad
  specs before that (engine fields next to ``spec.kafka``, order AddThenRemove);
* :class:`KafkaMembership` is the Kafka membership backend of the resource's one daemon (lifecycle.py
  ``Membership``): its passes, its watchdog budget, its stale report; its ``body`` is kopf's live
  view, so a spec change takes effect on the next pass;
* client settings: ``spec.kafka.clientSecretRef`` names a Secret whose key (default
  ``client.properties``) is a Kafka client properties file (``security.protocol``, ``ssl.*``,
  ``sasl.*``, as ``--command-config``). Relative file names in it (PEM truststore / keystore) name
  other keys of the same Secret: they are written to a private temporary directory only while the
  TLS context loads them. The Secret is re-read every :data:`SECRET_REFRESH_S`; a changed one
  gives a new client. A missing Secret (``Pending``) or an unusable file (``Failed``) is reported
  in status and retried, since the Secret may be fixed without touching the KRaftQuorum.

Order: RemoveThenAdd only. Kafka keeps one directory id per voter id and answers AddRaftVoter for a
second one with DUPLICATE_VOTER (KIP-853), so AddThenRemove cannot work (watch.py says more).

Restart safety: the recovery records go to ``status.recoveries`` and the controllers' listeners to
``status.kafka.controllers`` before every voter change (the controller's ``persist`` hook), so an
operator restarted between RemoveRaftVoter and AddRaftVoter knows the old directory id and where
the new controller listens (Kafka lists only the voters' endpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from ..controller import ControllerStatus, RecoveryController
from ..core.view import QuorumView
from ..kafka.backend import KafkaQuorum
from ..kafka.clientconf import ClientConfigError, ClientSettings, fingerprint, settings_from_secret
from .context import OperatorContext, event_sink
from .crdstatus import (
    Beside,
    StatusProgressStore,
    StatusWriter,
    kafka_status,
    recoveries_status,
    unavailable_condition,
)
from .kafkaownership import Ownership, policy_for
from .kafkaspec import (
    KafkaSpec,
    note_schemas_missing,
    parse_kafka_spec,
    schemas_problem,
)
from .manifests import SpecError
from .watchdog import within

log = logging.getLogger("kraftkeeper.operator.kafka")

SECRET_REFRESH_S = 10.0
# All of a pass's Kubernetes API calls together, in the watchdog's budget (watchdog.py; each call
# alone is bounded by its KUBE_CALL_S).
KUBE_SLACK_S = 60.0
# A voter that went quiet (no fetch for QUIET_AFTER_MS) less than QUIET_FOR_S ago may be a
# controller whose volume is being replaced: its successor's first fetch is seconds away, and
# nothing else announces it (the controllers' pods are the user's; no pod event reaches this
# daemon), so the leader is described every QUIET_POLL_S instead of every interval until then.
QUIET_AFTER_MS = 1_000
QUIET_FOR_S = 60.0
QUIET_POLL_S = 0.25


def voter_recently_quiet(view: QuorumView | None, now_ms: int) -> bool:
    """A voter other than the leader last fetched between QUIET_AFTER_MS and QUIET_FOR_S ago."""
    if view is None:
        return False
    return any(
        v.id != view.leader_id and 0 <= v.last_fetch_ms and QUIET_AFTER_MS < now_ms - v.last_fetch_ms
        < QUIET_FOR_S * 1000
        for v in view.voters
    )


@dataclass
class KafkaManaged:
    """One KRaftQuorum with ``spec.kafka`` as its daemon keeps it."""

    spec: KafkaSpec
    api: KafkaQuorum
    controller: RecoveryController
    fingerprint: str  # of the Secret data the client was built from
    status: StatusWriter  # its status writes (crdstatus.py)
    ever_available: bool = False
    schemas_missing: str = ""  # schemas_problem() when the client was built

    def kafka_status(self) -> dict[str, Any]:
        return kafka_status(self.api.cluster_id, self.api.listeners)

    def recoveries_status(self) -> list[dict[str, Any]]:
        return recoveries_status(self.controller.book.records)

    def beside(self) -> Beside:
        """What a progress save writes beside the records: before a voter change where the new
        controller listens, after one the voter set it made (crdstatus.py)."""
        return Beside(self.controller.committed_view, kafka=self.kafka_status())


class KafkaMembership:
    """The Kafka membership backend of one resource (lifecycle.py ``Membership``): its passes;
    ``m`` is None while no usable client could be built."""

    def __init__(self, ctx: OperatorContext, body: kopf.Body) -> None:
        self.ctx, self.body = ctx, body
        self.m: KafkaManaged | None = None
        self.generation = -1
        self.spec: KafkaSpec | None = None
        self.secret: Mapping[str, str] | None = None
        self.secret_read_at = -1e9
        self.problem = ""  # the last reported client-setting problem (one Warning per change)
        self.ownership = Ownership()  # one owner per Kafka quorum (ownership.py)

    async def close(self) -> None:
        if self.m is not None:
            await self.m.api.close()
            self.ctx.metrics.forget(self.m.spec.cluster)
            self.m = None

    def _status_writer(self, q: KafkaSpec, shown: Mapping[str, Any]) -> StatusWriter:
        return StatusWriter(self.ctx.kube, q.base.namespace, q.base.name, shown, bound=within)

    def _client_bounds(self) -> tuple[float, float]:
        """(one operation's bound, one voter change's bound) of the client, or of a client with
        the default settings while there is none yet."""
        api = self.m.api if self.m is not None else KafkaQuorum([])
        return api.api_timeout, api.operation_budget()

    def pass_budget(self) -> float:
        """The watchdog's limit for one pass: up to MAX_STEPS voter changes, each with a describe
        before it, every Kafka operation at its client's bound, plus the API server's share."""
        describe, change = self._client_bounds()
        return KUBE_SLACK_S + RecoveryController.MAX_STEPS * (describe + change)

    def slow_after(self) -> float:
        """A pass longer than one Kafka operation's bound is worth a log line."""
        return self._client_bounds()[0]

    async def abandon(self) -> None:
        """Drop the client and controller after a hung pass; the next pass builds new ones from
        the persisted status (kopf's live body), as a restarted operator does."""
        m, self.m = self.m, None
        self.secret_read_at = -1e9
        if m is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(m.api.close(), KUBE_SLACK_S)

    async def report_stale(self, why: str) -> None:
        """Say in ``Degraded`` that the status was not refreshed and why (a failed or hung pass):
        voters and phase as last written must not pass for current."""
        if self.m is not None:
            await self.m.status.report_stale(why)

    async def step(self) -> float:
        """One pass; returns the seconds to wait before the next."""
        gen = int((self.body.get("metadata") or {}).get("generation") or 0)
        if gen != self.generation:
            self.generation = gen
            try:
                self.spec = parse_kafka_spec(self.body)
            except SpecError:
                self.spec = None  # reconcile_kafka reported it; wait for a new generation
            self.secret_read_at = -1e9
        if self.spec is None:
            await self.close()
            return self.ctx.interval
        if not await self._ensure_client(self.spec):
            return max(self.ctx.interval, 2.0)
        assert self.m is not None
        # Another resource owning the same quorum: observe only, never a voter change.
        owner = await self.ownership.decide(self.ctx, self.body, self.m.api)
        self.m.controller.set_policy(policy_for(self.spec.policy, owner))
        st = await self.m.controller.reconcile()
        await self.ownership.report(self.ctx.kube, self.body, st, owner)
        await self._write_status(st)
        pause = self.m.controller.wake_in(self.ctx.interval)
        if voter_recently_quiet(self.m.controller.last_view, self.m.controller.now_ms()):
            return min(pause, QUIET_POLL_S)
        return pause

    async def _read_secret(self, q: KafkaSpec) -> tuple[str, str] | None:
        """(fingerprint, "") with self.secret updated, or ("", problem). None: keep the client."""
        now = time.monotonic()
        if self.m is not None and self.m.spec == q and now - self.secret_read_at < SECRET_REFRESH_S:
            return None
        self.secret_read_at = now
        if q.secret_name is None:
            self.secret = {}
            return fingerprint({}), ""
        where = f"Secret {q.base.namespace}/{q.secret_name}"
        data = await within(where, self.ctx.kube.secret_data(q.base.namespace, q.secret_name))
        if data is None:
            return (
                "",
                f"Secret {q.base.namespace}/{q.secret_name} (spec.kafka.clientSecretRef) does not exist",
            )
        self.secret = data
        return fingerprint(data), ""

    async def _ensure_client(self, q: KafkaSpec) -> bool:
        got = await self._read_secret(q)
        if got is None:
            return self.m is not None
        fp, problem = got
        if not problem and self.m is not None and self.m.spec == q and self.m.fingerprint == fp:
            return True
        settings: ClientSettings | None = None
        if not problem and q.secret_name is not None:
            where = f"Secret {q.base.namespace}/{q.secret_name}"
            try:
                settings = settings_from_secret(self.secret or {}, q.secret_key, where)
            except ClientConfigError as e:
                problem = str(e)
        if problem:
            await self._report_problem(q, problem, missing="does not exist" in problem)
            return False
        await self._configure(q, settings, fp)
        return True

    async def _report_problem(self, q: KafkaSpec, problem: str, *, missing: bool) -> None:
        await self.close()
        reason = "ClientSecretMissing" if missing else "InvalidClientConfig"
        status = {
            "phase": "Pending" if missing else "Failed",
            "observedGeneration": q.base.generation,
            "conditions": [unavailable_condition(reason, problem)],
        }
        if problem != self.problem:  # one Warning per distinct problem
            self.problem = problem
            await self.ctx.kube.notify(self.body, warning=True, reason=reason, message=problem)
            log.warning("%s: %s", q.cluster, problem)
        live = self.body.get("status") or {}
        shown: Mapping[str, Any] = next(
            (c for c in live.get("conditions") or [] if c.get("type") == "Available"), {}
        )
        if live.get("phase") != status["phase"] or shown.get("message") != problem[:32000]:
            await self._status_writer(q, live).send(status)

    async def _configure(self, q: KafkaSpec, settings: ClientSettings | None, fp: str) -> None:
        """A new client (first pass, changed bootstrap or Secret) under the same controller."""
        self.problem = ""
        # Kafka's own timeouts (request.timeout.ms, default.api.timeout.ms in the client
        # properties, or wire.py's defaults), not the operator's short one for in-cluster pods: a
        # Kafka cluster may be a SASL_SSL handshake away over a real network.
        api = KafkaQuorum(list(q.bootstrap), settings)
        if self.m is not None:
            api.listeners.update(self.m.api.listeners)
            await self.m.api.close()
            self.m.api = self.m.controller.api = api
            self.m.spec, self.m.fingerprint = q, fp
            self.m.controller.set_policy(q.policy)
            self.m.controller.sink = event_sink(q.base, self.ctx.kube)
            return
        writer = self._status_writer(q, self.body.get("status") or {})
        progress = StatusProgressStore(writer, q.cluster)
        saved = await progress.load()
        api.listeners.update(saved.known.listeners)
        ctl = RecoveryController(
            api,
            q.policy,
            cluster=q.cluster,
            sink=event_sink(q.base, self.ctx.kube),
            metrics=self.ctx.metrics,
            records=saved.records,
            persist=progress.save,
            desired_ids=None,  # Kafka has no reassignment: the voter ids are the user's business
        )
        ctl.known_voters = saved.known.voters
        m = KafkaManaged(q, api, ctl, fp, writer, schemas_missing=schemas_problem())
        progress.beside = m.beside
        self.m = m
        if m.schemas_missing:
            await self.ctx.kube.notify(
                self.body, warning=True, reason="KafkaSchemasMissing", message=m.schemas_missing
            )
            log.error("%s: voter changes are impossible: %s", q.cluster, m.schemas_missing)
        log.info(
            "%s: managing the Kafka controller quorum at %s",
            q.cluster,
            ",".join(f"{h}:{p}" for h, p in q.bootstrap),
        )

    async def _write_status(self, st: ControllerStatus) -> None:
        """As for our own quorums: written only when something but a timestamp changed."""
        m = self.m
        assert m is not None
        if st.view is not None and not st.condition("QuorumLost").status:
            m.ever_available = True
        if m.schemas_missing and m.spec.policy.enabled:
            note_schemas_missing(st, m.schemas_missing)
        gen = m.spec.base.generation
        extra = {"kafka": m.kafka_status(), "observedGeneration": gen}
        recs = m.recoveries_status()
        await m.status.write_pass(st, gen, recs, ever_available=m.ever_available, extra=extra)
