"""The one driver of the consensus core, used by the node, the simulation and the core tests.

* :mod:`quorum.driver.ports`: the narrow Protocols it talks to (log, quorum state, snapshots,
  transport, clock, state machine, sink);
* :mod:`quorum.driver.driver`: :class:`Driver`, carrying out a ``Ready`` in three phases
  (``begin`` / ``persist`` / ``finish``) in the order :mod:`quorum.core.ready` documents;
* :mod:`quorum.driver.runner`: :class:`AsyncRunner`, the asyncio loop a node runs;
* :mod:`quorum.driver.memory`: in-memory clock, transport, sink and state machine (the
  in-memory storage is ``quorum.storage.memory``).

How a node wires it (the node keeps HTTP, client futures and correlation ids)::

    meta, qstore, log, snapshots, summary = open_storage(data_dir)
    kv = KVStore()                                     # a StateMachine
    applied_end, applied_epoch = load_latest_snapshot(snapshots, summary, kv)
    core = RaftCore(core_config, local, cluster_id, qstore.load(cluster_id), summary,
                    StorageReader(log, snapshots), random.Random(), clock.now_ms())
    ports = Ports(log=log, quorum_state=qstore, snapshots=snapshots,
                  transport=http_transport,            # .send(Outbound), never blocks
                  clock=clock,                         # .now_ms()
                  state_machine=kv,
                  sink=node_sink)                      # proposal_done, read_done, admin_done,
                                                       # role_changed, applied, recovery_needed, note
    driver = Driver(core, ports, applied_end, applied_epoch)
    runner = AsyncRunner(driver, tick_ms=cfg.tick_ms)
    await runner.run(stop_event)                       # raises if the driver fails: exit non-zero

    # inbound RPC (HTTP handler): remember the waiter under a local correlation id, then
    runner.step(dataclasses.replace(request, correlation_id=local_cid))
    # the response comes back through http_transport.send(Outbound(response)) -> answer it
    # outbound request: http_transport.send(out) POSTs, then runner.step(response or RpcFailed)
    # client write: last = core.propose([record], now); runner.wake(); wait for
    #   sink.proposal_done(ProposalResult(last, ...)) (NONE: committed and applied)
    # role: sink.role_changed(view) is called once at start with the restored role, then on
    #   every transition; driver.published is the latest view.
"""

from quorum.driver.driver import Driver, Pending, Ports, StorageReader, load_latest_snapshot
from quorum.driver.ports import Clock, LogPort, QuorumStatePort, Sink, SnapshotPort, StateMachine, Transport
from quorum.driver.runner import AsyncRunner

__all__ = [
    "AsyncRunner",
    "Clock",
    "Driver",
    "LogPort",
    "Pending",
    "Ports",
    "QuorumStatePort",
    "Sink",
    "SnapshotPort",
    "StateMachine",
    "StorageReader",
    "Transport",
    "load_latest_snapshot",
]
