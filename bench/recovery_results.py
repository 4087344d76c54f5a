"""The disk-failure recovery bench's results (:class:`RecoveryResult`, one per replaced
disk) and their Markdown table, with the transport note and the per-revision comparison of
``--baseline REV``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.recovery_ops import (
    MB,
)

# Said with every result: by default the nodes run without --tls-dir, so catch-up
# crosses plaintext HTTP on loopback (``--tls``: mutual TLS). With node TLS (TLS 1.3,
# AES-256-GCM) the leader also encrypts and the replica decrypts every byte (measured on this
# project's VM: about 0.9 and 0.7 CPU s per GB, OpenSSL through the ssl module); sendfile is
# impossible under TLS.
TRANSPORT_NOTE = ("node-to-node transport: plaintext HTTP on loopback (nodes started without --tls-dir; "
                  "--tls for mutual TLS)")


TLS_NOTE = "node-to-node transport: mutual TLS on loopback (--tls: nodes started with --tls-dir)"


@dataclass
class RecoveryResult:
    size_bytes: int
    filled_bytes: int
    leader_dir_bytes: int
    received_bytes: int  # what the replaced replica holds after catch-up: the bytes it received
    fill_s: float
    catch_up_s: float
    catch_up_mb_per_s: float
    add_voter_s: float
    remove_voter_s: float
    total_s: float
    restart_to_first_fetch_s: float
    via_snapshot: bool
    copy_s: float = 0.0
    copy_mb_per_s: float = 0.0
    catch_up_to_copy: float = 0.0  # catch-up MB/s / copy MB/s: the headline
    leader_cpu_s: float = 0.0  # CPU seconds the leader and the replica spent during catch-up
    replica_cpu_s: float = 0.0
    rev: str = ""  # the --baseline revision that ran it; "" for the current code


def render(results: list[RecoveryResult], tls: bool = False) -> str:
    """The table, then one headline per size: catch-up as a fraction of the plain copy (the
    median over the rounds, each round's ratio taken beside its own copy)."""
    head = (f"{'engine':>8} {'log size':>9} {'received':>9} {'catch-up s':>10} {'MB/s':>7} {'copy MB/s':>9} "
            f"{'ratio':>6} {'snapshot':>8} {'restart->fetch s':>16} {'add-voter ms':>12} "
            f"{'remove-voter ms':>15} {'total s':>8} {'fill s':>7} {'lead cpu':>7} {'repl cpu':>8}")
    lines = [TLS_NOTE if tls else TRANSPORT_NOTE, head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{'@' + r.rev if r.rev else 'current':>8} {r.size_bytes / MB:>7.0f}MB "
            f"{r.received_bytes / MB:>7.1f}MB {r.catch_up_s:>10.2f} "
            f"{r.catch_up_mb_per_s:>7.1f} {r.copy_mb_per_s:>9.1f} {r.catch_up_to_copy:>6.2f} "
            f"{'yes' if r.via_snapshot else 'no':>8} {r.restart_to_first_fetch_s:>16.2f} "
            f"{r.add_voter_s * 1000:>12.1f} {r.remove_voter_s * 1000:>15.1f} {r.total_s:>8.2f} "
            f"{r.fill_s:>7.1f} {r.leader_cpu_s:>7.2f} {r.replica_cpu_s:>8.2f}"
        )
    lines.append("")
    for size, rev in dict.fromkeys((r.size_bytes, r.rev) for r in results):
        rs = [r for r in results if r.size_bytes == size and r.rev == rev]
        ratio = statistics.median(r.catch_up_to_copy for r in rs)
        rate = statistics.median(r.catch_up_mb_per_s for r in rs)
        copy = statistics.median(r.copy_mb_per_s for r in rs)
        cpu = statistics.median(r.replica_cpu_s / max(1e-9, r.received_bytes / (1000 * MB)) for r in rs)
        who = f" @{rev}" if rev else ""
        lines.append(f"{size / MB:.0f} MB{who}: catch-up at {ratio:.2f}x the plain copy of the same bytes "
                     f"({rate:.0f} vs {copy:.0f} MB/s), replica {cpu:.2f} CPU s per GB, median of {len(rs)}")
    lines.extend(compare_revs(results))
    return "\n".join(lines)


def compare_revs(results: list[RecoveryResult]) -> list[str]:
    """With --baseline: per size, the current code's catch-up against REV's in the same run,
    as the ratio of their medians (copy-relative and MB/s), with each round's pair."""
    out: list[str] = []
    for size in dict.fromkeys(r.size_bytes for r in results):
        now = [r for r in results if r.size_bytes == size and not r.rev]
        for rev in dict.fromkeys(r.rev for r in results if r.size_bytes == size and r.rev):
            old = [r for r in results if r.size_bytes == size and r.rev == rev]
            if not now or not old:
                continue
            x_copy = statistics.median(r.catch_up_to_copy for r in now) / max(
                1e-9, statistics.median(r.catch_up_to_copy for r in old))
            x_rate = statistics.median(r.catch_up_mb_per_s for r in now) / max(
                1e-9, statistics.median(r.catch_up_mb_per_s for r in old))
            pairs = ", ".join(f"{a.catch_up_mb_per_s / max(1e-9, b.catch_up_mb_per_s):.2f}"
                              for a, b in zip(now, old, strict=False))
            out.append(f"{size / MB:.0f} MB current / @{rev}: {x_copy:.2f}x (copy-relative), "
                       f"{x_rate:.2f}x (MB/s); per round MB/s {pairs}")
    return out
