"""Failpoints for crash tests (the idea of etcd's gofail): an environment variable makes the
operator stop at a named point of a recovery, so a test can kill or restart it exactly there.
One mechanism for every mode: the Kubernetes operator, ``operator local`` and ``operator watch``
all run the same :class:`~.controller.RecoveryController`, which calls :func:`hit`.

``KRAFTKEEPER_FAILPOINT`` = a comma-separated list of ``POINT`` or ``POINT=ACTION``:

* ``after-add-voter-committed``: AddVoter committed and its ``add_voter_committed`` event is in the
  event log, but the progress is not persisted yet and RemoveVoter has not started (the worst
  instant for an operator crash: the restarted one must resume with RemoveVoter and must not log
  the commit twice);
* ``after-remove-voter-committed``: the same after RemoveVoter;
* ``before-event:<type>``: just before the controller logs an event of that type (and so before
  the step the event announces), e.g. ``before-event:add_voter_started``.

ACTION: ``exit`` (default; the process exits at once with status :data:`EXIT_CODE`, no clean-up,
like a SIGKILL) or ``hang`` (the process stops doing anything, its event loop included, until it is
killed from outside, e.g. a Kubernetes pod deleted while it hangs).

``KRAFTKEEPER_FAILPOINT_ONCE`` = a file path: the failpoint fires only if that file does not exist,
and creates it first; so a restarted operator with the same environment (a pod recreated from
its Deployment) runs through. The Kafka watcher's older ``KRAFTKEEPER_WATCH_FAILPOINT`` =
``crash-before:<type>`` is read too, as ``before-event:<type>=exit``.

A bad value is refused at start-up (:func:`check`) with a message naming the variable.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("kraftkeeper.operator.failpoints")

ENV = "KRAFTKEEPER_FAILPOINT"
ONCE_ENV = "KRAFTKEEPER_FAILPOINT_ONCE"
WATCH_ENV = "KRAFTKEEPER_WATCH_FAILPOINT"  # kept for the Kafka watcher's tests
EXIT_CODE = 75  # EX_TEMPFAIL: distinguishable from a crash or a clean stop

AFTER_ADD_COMMITTED = "after-add-voter-committed"
AFTER_REMOVE_COMMITTED = "after-remove-voter-committed"
BEFORE_EVENT = "before-event:"
POINTS = frozenset({AFTER_ADD_COMMITTED, AFTER_REMOVE_COMMITTED})
ACTIONS = frozenset({"exit", "hang"})


class FailpointError(ValueError):
    """A failpoint variable that does not parse (names the variable and the bad item)."""


def parse(value: str, var: str = ENV) -> dict[str, str]:
    """``POINT[=ACTION],...`` -> {point: action}; raises :class:`FailpointError`."""
    out: dict[str, str] = {}
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        point, _, action = item.partition("=")
        point, action = point.strip(), (action.strip() or "exit")
        if point.startswith(BEFORE_EVENT):
            if not point[len(BEFORE_EVENT) :]:
                raise FailpointError(f"{var}={value!r}: {point!r} needs an event type after the colon")
        elif point not in POINTS:
            known = ", ".join(sorted(POINTS)) + f", {BEFORE_EVENT}<event type>"
            raise FailpointError(f"{var}={value!r}: unknown failpoint {point!r} (known: {known})")
        if action not in ACTIONS:
            raise FailpointError(
                f"{var}={value!r}: unknown action {action!r} for {point} (known: exit, hang)"
            )
        out[point] = action
    return out


def armed(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The failpoints the environment arms (raises :class:`FailpointError` on a bad value)."""
    env = os.environ if environ is None else environ
    out = parse(env.get(ENV, ""))
    legacy = env.get(WATCH_ENV, "")
    if legacy:
        if not legacy.startswith("crash-before:") or not legacy.split(":", 1)[1]:
            raise FailpointError(f"{WATCH_ENV}={legacy!r}: expected crash-before:<event type>")
        out.setdefault(BEFORE_EVENT + legacy.split(":", 1)[1], "exit")
    return out


def check(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Validate the failpoint variables at start-up; logs the armed ones (a test hook in use)."""
    points = armed(environ)
    if points:
        log.warning("test hook %s in use: %s", ENV, points)
    return points


def hit(point: str) -> None:
    """Stop here if ``point`` is armed (module docstring); otherwise return at once. A variable
    that does not parse arms nothing here: start-up (:func:`check`) has refused it already."""
    if not os.environ.get(ENV) and not os.environ.get(WATCH_ENV):
        return
    try:
        action = armed().get(point)
    except FailpointError:
        return
    if action is None:
        return
    once = os.environ.get(ONCE_ENV)
    if once:
        marker = Path(once)
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        with open(marker, "w") as f:  # durable before we stop: the restarted process runs through
            f.write(f"{point}={action} pid {os.getpid()}\n")
            f.flush()
            os.fsync(f.fileno())
    log.error("failpoint %s=%s reached: %s", point, action, "exiting now" if action == "exit" else "hanging")
    logging.shutdown()
    if action == "exit":
        os._exit(EXIT_CODE)
    while True:  # hang: block everything, the event loop included, until killed
        time.sleep(3600)
