"""One owner per Kafka controller quorum among the KRaftQuorums with ``spec.kafka`` (kube.py).

Two resources whose ``spec.kafka.bootstrapControllers`` reach the same Kafka controller quorum
would both run the recovery controller and race each other's voter changes (both sending
RemoveRaftVoter / AddRaftVoter for one replacement). KIP-853 serialises the changes inside Kafka,
but not the decisions: the second controller would act on a view the first one is changing.

The rule, derived from the API server on every pass (so a restarted operator, or a second
replica of it, picks the same owner without remembering anything):

* two resources watch the same quorum when both know Kafka's cluster id (``status.kafka.clusterId``,
  from DescribeCluster) and it is equal; while either does not know it, when their endpoints
  overlap: the bootstrap list, the controllers' listeners Kafka reported (DescribeQuorum v2 Nodes,
  ``status.kafka.controllers``), each as written and as resolved to addresses. Two different
  cluster ids are two quorums even at the same address (a quorum rebuilt in place);
* the owner of a quorum is the resource that was created first (``metadata.creationTimestamp``;
  ties by namespace/name), among the resources with a parseable ``spec.kafka`` that are not being
  deleted and have had a working client: ``status.kafka`` written (by an operator that reached
  Kafka), and not ``Pending`` / ``Failed`` for a missing or unusable Secret. Such a resource
  cannot heal anything, and may be a leftover nobody watches or whose quorum is gone. When its
  Secret is fixed it takes over again, as when it was created: the controller then finds the
  quorum as a restarted operator would. Two resources created within a pass of each other may
  both act until the older one's first status write (about a second);
* the others observe only (recovery policy disabled: no recovery is started, no voter change is
  sent), say ``Degraded`` with reason ``OwnerConflict`` naming the owner, post one Warning Event
  per episode, and take over on the first pass after the owner is gone.

One list per pass, not one per resource: the daemons of every ``spec.kafka`` resource share the
operator's KRaftQuorum list (:class:`SharedLists`, per API client): a list younger than
:data:`LIST_SHARE_S` serves them all, and passes that run together await the same call. A decision
may therefore see the resources as they were up to that long ago (a takeover comes that much
later; the window in which two new resources both act grows by as much).

What the rule cannot see: resources the operator cannot list. It lists KRaftQuorums cluster-wide,
or only in the resource's namespace when its RBAC refuses that (the chart's namespace-scoped
mode); two operator processes watching different namespaces therefore do not see each other's
resources, and both would act. docs/operator.md says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from ..core.policy import RecoveryPolicy
from ..core.status import ControllerStatus
from ..kafka.backend import KafkaQuorum, parse_bootstrap
from .context import OperatorContext
from .kube import KubeApi
from .manifests import GROUP, PLURAL, VERSION
from .watchdog import within

log = logging.getLogger("kraftkeeper.operator.kafka")

REASON = "OwnerConflict"
TAKEN_REASON = "OwnershipTaken"
# A resource in these phases has no working Kafka client (kube.py's _report_problem).
IDLE_PHASES = ("Pending", "Failed")
RESOLVE_TIMEOUT_S = 2.0
RESOLVE_TTL_S = 60.0
LIST_SHARE_S = 1.0  # a KRaftQuorum list this young serves every resource's pass


@dataclass(frozen=True)
class Claim:
    """One KRaftQuorum with ``spec.kafka`` as the ownership rule sees it."""

    namespace: str
    name: str
    created: str  # metadata.creationTimestamp (RFC 3339, UTC: sorts as text)
    endpoints: frozenset[str]  # "host:port" as written and as resolved
    cluster_id: str = ""
    deleting: bool = False
    # No working client: never had one (no status.kafka: not yet seen by an operator, or by none
    # that watches its namespace), or status.phase Pending / Failed (Secret missing or unusable).
    idle: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def order(self) -> tuple[str, str, str]:
        return (self.created, self.namespace, self.name)


def same_quorum(a: Claim, b: Claim) -> bool:
    """Whether two resources reach the same Kafka controller quorum (module docstring)."""
    if a.cluster_id and b.cluster_id:
        return a.cluster_id == b.cluster_id
    return bool(a.endpoints & b.endpoints)


def owner_of(me: Claim, peers: Iterable[Claim]) -> Claim:
    """The owner of ``me``'s quorum: the oldest live resource connected to ``me`` by
    :func:`same_quorum` (transitively: A overlapping B overlapping C is one quorum)."""
    others = [p for p in peers if not (p.deleting or p.idle) and p.key != me.key]
    group, todo = [me], [me]
    while todo:
        cur = todo.pop()
        for p in others:
            if p not in group and same_quorum(cur, p):
                group.append(p)
                todo.append(p)
    return min(group, key=Claim.order)


def policy_for(policy: RecoveryPolicy, owner: Claim | None) -> RecoveryPolicy:
    """The recovery policy of a pass: the resource's own, or recovery off (observe and report
    only) while ``owner`` (another resource) owns the quorum."""
    return policy if owner is None else dataclasses.replace(policy, enabled=False)


def norm_host(host: str) -> str:
    return host.strip("[]").rstrip(".").lower()


def claim_endpoints(body: Mapping[str, Any]) -> set[tuple[str, int]]:
    """The (host, port) pairs a resource names or has seen: its bootstrap list and the
    controllers' listeners in its status; empty if the bootstrap list does not parse."""
    kafka = (body.get("spec") or {}).get("kafka") or {}
    boot = kafka.get("bootstrapControllers")
    if not isinstance(boot, list) or not all(isinstance(b, str) for b in boot):
        return set()
    try:
        out = {(norm_host(h), p) for h, p in parse_bootstrap(",".join(boot), "bootstrapControllers")}
    except ValueError:
        return set()
    for c in ((body.get("status") or {}).get("kafka") or {}).get("controllers") or []:
        for x in (c.get("listeners") if isinstance(c, Mapping) else None) or []:
            if isinstance(x, Mapping) and isinstance(x.get("host"), str) and isinstance(x.get("port"), int):
                out.add((norm_host(x["host"]), x["port"]))
    return out


def claim_of(body: Mapping[str, Any], resolved: Mapping[str, frozenset[str]]) -> Claim | None:
    """A resource's :class:`Claim` (None: no usable ``spec.kafka``); ``resolved`` maps a host to
    its addresses (missing or empty: not resolved, only the written form counts)."""
    pairs = claim_endpoints(body)
    if not pairs:
        return None
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    keys = {f"{h}:{p}" for h, p in pairs}
    keys |= {f"{a}:{p}" for h, p in pairs for a in resolved.get(h, frozenset())}
    return Claim(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        endpoints=frozenset(keys),
        cluster_id=str((status.get("kafka") or {}).get("clusterId") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        idle=status.get("phase") in IDLE_PHASES or not isinstance(status.get("kafka"), Mapping),
    )


def conflict_message(owner: Claim) -> str:
    cid = f" (cluster id {owner.cluster_id})" if owner.cluster_id else ""
    return (
        f"the Kafka controller quorum{cid} is managed by KRaftQuorum {owner.key}, the oldest resource "
        "pointing at it: this one makes no voter change and takes over when that one is deleted"
    )


class SharedLists:
    """The KRaftQuorum lists of one operator process, shared by every resource's ownership
    decision: per scope ("" cluster-wide, else a namespace), a list younger than ``ttl`` seconds
    is served again, and callers arriving while it is being fetched await that same call. A failed
    list is not kept: the next caller lists again."""

    def __init__(self, ttl: float = LIST_SHARE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self.calls = 0  # list calls made (tests count them)
        self._got: dict[str, tuple[float, asyncio.Future[list[dict[str, Any]]]]] = {}

    async def get(
        self, scope: str, call: Callable[[], Awaitable[list[dict[str, Any]]]]
    ) -> list[dict[str, Any]]:
        now = self.clock()
        hit = self._got.get(scope)
        if hit is not None and hit[1].done() and (hit[1].cancelled() or hit[1].exception() is not None):
            hit = None
        if hit is None or (hit[1].done() and now - hit[0] >= self.ttl):
            self.calls += 1
            hit = (now, asyncio.ensure_future(call()))
            self._got[scope] = hit
        # Shielded: a caller cancelled by its watchdog does not cancel the others' list.
        return list(await asyncio.shield(hit[1]))


_SHARED: weakref.WeakKeyDictionary[object, SharedLists] = weakref.WeakKeyDictionary()


def shared_lists(kube: object) -> SharedLists:
    """The :class:`SharedLists` of the operator process's API client ``kube``."""
    got = _SHARED.get(kube)
    if got is None:
        got = _SHARED[kube] = SharedLists()
    return got


class Ownership:
    """The ownership state of one resource's daemon: the host resolution cache and the owner of
    the last pass (for one Event per episode)."""

    def __init__(self) -> None:
        self.owner: str | None = None  # the owner's key of the last pass; None: none decided yet
        self.cluster_wide = True  # False once the API refused a cluster-wide list (403)
        self._resolved: dict[str, tuple[float, frozenset[str]]] = {}

    async def _resolve(self, hosts: Iterable[str]) -> dict[str, frozenset[str]]:
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        for h in set(hosts):
            hit = self._resolved.get(h)
            if hit is not None and now - hit[0] < RESOLVE_TTL_S:
                continue
            try:
                infos = await asyncio.wait_for(loop.getaddrinfo(h, None), RESOLVE_TIMEOUT_S)
                addrs = frozenset(str(i[4][0]) for i in infos)
            except (OSError, TimeoutError):
                addrs = frozenset()  # unresolvable now: compared as written only
            self._resolved[h] = (now, addrs)
        return {h: v for h, (_, v) in self._resolved.items()}

    async def _list(self, ctx: OperatorContext, ns: str) -> list[dict[str, Any]]:
        custom = ctx.kube.custom
        shared = shared_lists(ctx.kube)

        async def everywhere() -> list[dict[str, Any]]:
            call = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            return list((await within("listing KRaftQuorums", call)).get("items") or [])

        async def namespaced() -> list[dict[str, Any]]:
            call = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
            return list((await within(f"listing KRaftQuorums in {ns}", call)).get("items") or [])

        if self.cluster_wide:
            try:
                return await shared.get("", everywhere)
            except ApiException as e:
                if e.status != 403:
                    raise
                self.cluster_wide = False  # namespace-scoped RBAC: the namespace's resources only
        return await shared.get(ns, namespaced)

    async def decide(self, ctx: OperatorContext, body: Mapping[str, Any], api: KafkaQuorum) -> Claim | None:
        """The owner of this resource's quorum if it is another resource, else None. The live
        client's cluster id and listeners count as this resource's (its status may lag)."""
        if not api.cluster_id and not api.listeners:
            # A new client knows only the bootstrap list: learn the quorum's identity before
            # deciding, or a resource reaching the quorum by other names would act once.
            try:
                await api.describe()
            except Exception as e:  # an unreachable quorum: the pass itself reports it
                log.debug("describe before the ownership decision failed: %s", e)
        meta = body.get("metadata") or {}
        items = [i for i in await self._list(ctx, str(meta.get("namespace") or "")) if _is_kafka(i)]
        status = dict(body.get("status") or {})
        kafka = dict(status.get("kafka") or {})
        if api.cluster_id:
            kafka["clusterId"] = api.cluster_id
        lst = [{"listeners": [{"host": h, "port": p} for _, h, p in v]} for v in api.listeners.values()]
        kafka["controllers"] = list(kafka.get("controllers") or []) + lst
        mine = {**body, "status": {**status, "kafka": kafka}}
        hosts = {h for b in [mine, *items] for h, _ in claim_endpoints(b)}
        resolved = await self._resolve(hosts)
        me = claim_of(mine, resolved)
        if me is None:
            return None
        peers = [c for c in (claim_of(i, resolved) for i in items) if c is not None]
        owner = owner_of(me, peers)
        return None if owner.key == me.key else owner

    async def report(self, kube: KubeApi, body: kopf.Body, st: ControllerStatus, owner: Claim | None) -> None:
        """Degraded (reason OwnerConflict) while another resource owns the quorum; a Warning Event
        when an episode starts (not again after an operator restart: the status says it
        already), an Info Event when this resource takes over."""
        key = None if owner is None else owner.key
        if owner is not None:
            msg = conflict_message(owner)
            st.annotate_degraded(REASON, msg)
            conds = (body.get("status") or {}).get("conditions") or []
            shown: Mapping[str, Any] = next((c for c in conds if c.get("type") == "Degraded"), {})
            said = shown.get("reason") == REASON and f"KRaftQuorum {owner.key}," in str(shown.get("message"))
            if key != self.owner and not said:
                await kube.notify(body, warning=True, reason=REASON, message=msg)
                log.warning("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], msg)
        elif self.owner is not None:
            msg = (
                f"KRaftQuorum {self.owner} no longer manages this Kafka controller quorum: this one does now"
            )
            await kube.notify(body, warning=False, reason=TAKEN_REASON, message=msg)
            log.info("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], msg)
        self.owner = key


def _is_kafka(body: Mapping[str, Any]) -> bool:
    spec = body.get("spec")
    return isinstance(spec, Mapping) and spec.get("kafka") is not None
