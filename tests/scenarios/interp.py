"""A small interpreter for scenario files (tests/scenarios/*.txt) over the simulation
harness, in the spirit of etcd's raft testdata: a prose header (lines starting with ``#``)
says what the scenario shows; every other line is one command. Commands:

``cluster voters=N [spares=M] [seed=S] [prevote=on|off]``  start a simulated cluster
``run MS``                         let MS simulated milliseconds pass
``write N``                        commit N records through the leader (waits for a leader)
``read``                           a linearizable read through the leader (must complete)
``crash ID|leader`` / ``restart ID`` / ``partition ID|leader|follower`` / ``heal``
``cut ID ID|leader``               cut the link between two nodes only
``resign ID|leader`` / ``shutdown ID|leader``  graceful hand-off (EndQuorumEpoch), shutdown also stops it
``replace-disk ID``                ID loses its directory and returns with a new storage UUID
``reattach-old-disk ID``           ID's lost disk comes back: old (id, UUID), old log, stale voters
``add-voter ID old|new -> CODE``   AddVoter for ID's previous or current UUID; expect CODE
``remove-voter ID old|new -> CODE``
``reassign 1,2,4 -> CODE`` / ``reassign cancel -> CODE``
``recover-unclean ID``             offline KIP-704 plan on stopped replica ID, then restart it
``verify-recovery ID``             the driver verifies ID's RECOVERING state
``expect leader [ID|not ID] [within=MS]``  a leader exists (and is / is not ID), waiting up to MS
``expect voters 1 2 3:new ...``    the leader's voter set, ``ID`` = current UUID, ``ID:old`` = previous
``expect removed ID:old``          the key is in the removed set
``expect pending none|add|remove`` / ``expect target none|1,2,4``
``expect role ID ROLE [within=MS]``  e.g. ``expect role 1 follower``; ``expect not-role ID ROLE``
``expect epoch-unchanged`` / ``mark-epoch``  leader epoch did not change since ``mark-epoch``
``expect committed >= N`` / ``expect recovery RECOVERING|RECOVERED``
``settle``                         heal everything and check the quorum converges
Lines may end with a ``# comment``. A failing expectation raises with the file and line.
"""

from __future__ import annotations

from pathlib import Path

from quorum.core.recovery import plan_unclean_recovery
from quorum.storage import recover_log
from quorum.types import ReplicaKey
from tests.sim.chaos import settle
from tests.sim.harness import Sim
from tests.sim.nodes import Node


class ScenarioError(AssertionError):
    pass


class Interpreter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sim: Sim | None = None
        self.old: dict[int, str] = {}
        self.marked_epoch = -1
        self.line_no = 0

    def run(self) -> Sim:
        for i, raw in enumerate(self.path.read_text().splitlines(), 1):
            self.line_no = i
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                self.exec(line)
            except ScenarioError:
                raise
            except AssertionError as e:
                raise ScenarioError(f"{self.path.name}:{i}: {line}: {e}") from e
        assert self.sim is not None, f"{self.path.name}: no cluster command"
        return self.sim

    def fail(self, msg: str) -> None:
        raise ScenarioError(f"{self.path.name}:{self.line_no}: {msg}")

    # ------------------------------------------------------------------ helpers

    @property
    def s(self) -> Sim:
        if self.sim is None:
            self.fail("the first command must be 'cluster'")
        assert self.sim is not None
        return self.sim

    def node(self, tok: str) -> Node:
        if tok == "follower":
            ld = self.s.leader()
            for n in self.s.nodes.values():
                if n.core is not None and n is not ld and n.core.is_voter():
                    return n
            self.fail("no follower")
        if tok == "leader":
            ld = self.s.leader()
            if ld is None:
                self.fail("no leader")
            assert ld is not None
            return ld
        return self.s.nodes[int(tok)]

    def key_of(self, tok: str) -> ReplicaKey:
        if ":" in tok:
            i, which = tok.split(":")
            n = self.s.nodes[int(i)]
            return ReplicaKey(n.id, self.old[n.id] if which == "old" else n.uuid)
        n = self.s.nodes[int(tok)]
        return n.key

    TRANSIENT = frozenset(
        {
            "NOT_LEADER",
            "LEADERSHIP_LOST",
            "REPLICA_NOT_CAUGHT_UP",
            "REQUEST_TIMED_OUT",
            "VOTER_CHANGE_IN_PROGRESS",
        }
    )

    def admin(self, op: str, arg: object, want: str) -> None:
        """Submit an admin call like an operator would: retry transient answers (no leader
        yet, the replica not yet an observer or caught up) until ``want`` or a final answer."""
        got = "no answer"
        for _ in range(30):
            res = self.s.wait_admin(self.s.admin(op, arg), 6000)
            if res is not None:
                got = f"{res.error.value}: {res.message}"
                if res.error.value == want:
                    return
                transient = res.error.value in self.TRANSIENT or "not an observer" in res.message
                if not transient:
                    break
            self.s.run(300)
        self.fail(f"{op} {arg}: expected {want}, got {got}")

    # ------------------------------------------------------------------ commands

    def exec(self, line: str) -> None:
        words = line.split()
        cmd, args = words[0], words[1:]
        if cmd == "cluster":
            kv = dict(a.split("=") for a in args)
            self.sim = Sim(
                int(kv.get("seed", 1)),
                voters=int(kv["voters"]),
                spares=int(kv.get("spares", 0)),
                pre_vote=kv.get("prevote", "on") == "on",
            )
        elif cmd == "run":
            self.s.run(int(args[0]))
        elif cmd == "write":
            want = int(args[0])
            done = 0
            end = self.s.now + 20000
            while done < want and self.s.now < end:
                if self.s.write(1):
                    done += 1
                self.s.run(20)
            if done < want:
                self.fail(f"only {done} of {want} writes accepted")
            start = self.s.committed_end
            if not self.s.until(lambda: not self.s.proposals, 10000):
                self.fail(f"writes not committed (committed end {start})")
        elif cmd == "read":
            rid = None
            end = self.s.now + 10000
            while rid is None and self.s.now < end:
                rid = self.s.read()
                if rid is None:
                    self.s.run(50)
            if rid is None or not self.s.until(lambda: rid not in self.s.reads, 10000):
                self.fail("read did not complete")
        elif cmd == "crash":
            self.s.crash(self.node(args[0]))
        elif cmd == "restart":
            n = self.node(args[0])
            if n.core is None:
                self.s.start(n)
        elif cmd == "partition":
            a = self.node(args[0]).id
            self.s.blocked.update(frozenset((a, b)) for b in self.s.nodes if b != a)
        elif cmd == "cut":
            a, b = self.node(args[0]).id, self.node(args[1]).id
            self.s.blocked.add(frozenset((a, b)))
        elif cmd == "heal":
            self.s.blocked.clear()
        elif cmd in ("resign", "shutdown"):
            n = self.node(args[0])
            assert n.core is not None
            if cmd == "resign":
                n.core.resign(self.s.now)
            else:
                n.core.shutdown(self.s.now)
            self.s.pump(n)
            self.s.note(f"{cmd} node {n.id}")
            if cmd == "shutdown":
                self.s.run(50)  # let the EndQuorumEpoch requests leave before the process stops
                self.s.crash(n)
        elif cmd == "replace-disk":
            n = self.node(args[0])
            self.old[n.id] = n.uuid
            self.s.check_durable = False  # the lost disk may have held an acknowledged write
            self.s.replace_disk(n)
        elif cmd == "reattach-old-disk":
            self.s.reattach_old_disk(self.node(args[0]))
        elif cmd in ("add-voter", "remove-voter"):
            assert args[-2] == "->", "expected '-> CODE'"
            n = self.s.nodes[int(args[0])]
            k = ReplicaKey(n.id, self.old[n.id] if args[1] == "old" else n.uuid)
            self.admin("add" if cmd == "add-voter" else "remove", k, args[-1])
        elif cmd == "reassign":
            assert args[-2] == "->", "expected '-> CODE'"
            ids = None if args[0] == "cancel" else [int(x) for x in args[0].split(",")]
            self.admin("reassign", ids, args[-1])
        elif cmd == "recover-unclean":
            self.recover_unclean(self.s.nodes[int(args[0])])
        elif cmd == "verify-recovery":
            n = self.s.nodes[int(args[0])]
            if not self.s.until(lambda: n.id in self.s.recovery_needed, 10000):
                self.fail(f"node {n.id} never asked for recovery verification")
            assert n.core is not None
            n.core.recovery_verified(n.log.end_offset, self.s.now)
            self.s.pump(n)
        elif cmd == "settle":
            settle(self.s)
        elif cmd == "mark-epoch":
            ld = self.node("leader")
            assert ld.core is not None
            self.marked_epoch = ld.core.epoch
        elif cmd == "expect":
            self.expect(args)
        else:
            self.fail(f"unknown command {cmd!r}")

    def recover_unclean(self, n: Node) -> None:
        s = self.s
        s.crash(n)
        s.unclean = True
        cfg = s.config_for(n)
        summary = recover_log(n.log, n.snapshots)
        plan = plan_unclean_recovery(summary, n.qs, n.key, s.now, cfg.bootstrap_voters, n.endpoint)
        b = plan.batch
        n.log.append(b.base_offset, b.epoch, b.items(), b.append_time_ms)
        n.log.flush()
        n.qstore.save(plan.quorum_state)
        s.note(f"recover-unclean node {n.id}: epoch {plan.epoch}, removed {plan.removed}")
        s.start(n)

    def expect(self, args: list[str]) -> None:
        what = args[0]
        s = self.s
        within = 10000 if what == "leader" else 0
        for a in list(args):
            if a.startswith("within="):
                within = int(a.split("=")[1])
                args.remove(a)
        if what == "leader":
            if not s.until(lambda: s.leader() is not None, within):
                self.fail(f"no leader within {within} ms")
            ld = s.leader()
            assert ld is not None
            if len(args) == 2 and ld.id != int(args[1]):
                self.fail(f"leader is {ld.id}, expected {args[1]}")
            if len(args) == 3 and args[1] == "not" and ld.id == int(args[2]):
                self.fail(f"leader is {ld.id}")
            return
        ld = self.node("leader")
        assert ld.core is not None
        vs = ld.core.voters()
        if what == "voters":
            want = {self.key_of(t) for t in args[1:]}
            if set(vs.voters) != want:
                self.fail(f"voters {sorted(map(str, vs.voters))}, expected {sorted(map(str, want))}")
        elif what == "removed":
            for t in args[1:]:
                if self.key_of(t) not in vs.removed:
                    self.fail(f"{t} not in removed set {sorted(map(str, vs.removed))}")
        elif what == "pending":
            ch = ld.core.pending_voter_change()
            got = "none" if ch is None else ch.op
            if got != args[1]:
                self.fail(f"pending change {got}, expected {args[1]}")
        elif what == "target":
            got = "none" if vs.target_voters is None else ",".join(map(str, vs.target_voters))
            if got != args[1]:
                self.fail(f"target {got}, expected {args[1]}")
        elif what == "role":
            n = self.s.nodes[int(args[1])]
            s.until(lambda: n.core is not None and n.core.role_name == args[2], within)
            role = None if n.core is None else n.core.role_name
            if role != args[2]:
                self.fail(f"node {n.id} is {role}, expected {args[2]}")
        elif what == "not-role":
            n = self.s.nodes[int(args[1])]
            if n.core is not None and n.core.role_name == args[2]:
                self.fail(f"node {n.id} is {args[2]}")
        elif what == "epoch-unchanged":
            if ld.core.epoch != self.marked_epoch:
                self.fail(f"epoch moved from {self.marked_epoch} to {ld.core.epoch}")
        elif what == "committed":
            assert args[1] == ">="
            if s.committed_end < int(args[2]):
                self.fail(f"committed {s.committed_end} < {args[2]}")
        elif what == "recovery":
            if vs.recovery.value != args[1]:
                self.fail(f"recovery state {vs.recovery.value}, expected {args[1]}")
        else:
            self.fail(f"unknown expectation {what!r}")


__all__ = ["Interpreter", "ScenarioError"]
