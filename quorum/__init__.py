"""KRaftKeeper quorum engine: a KRaft-style Raft (KIP-595 / KIP-856) serving a replicated
key-value metadata store.

Layout:
  quorum.types     shared primitives (replica keys, control records, batch headers, error codes,
                   the cluster-id rule)
  quorum.records   the binary record-batch codec (pure functions)
  quorum.core      the consensus core: a pure state machine, no I/O, clock or randomness
  quorum.storage   meta.properties, segmented log, quorum-state file, snapshots (+ in-memory twins)
  quorum.driver    the one driver that carries out the core's Readies, and the ports it needs
  quorum.runtime   the node around the driver: aiohttp transport, server and its authorization
                   middleware, KV state machine, snapshots, limits, metrics
  quorum.security  the cluster PKI (pki issues, identity reads and says when a certificate is
                   due), tokens, authorization (pure), TLS contexts, the client config
  quorum.strictjson  strict JSON decoding of untrusted bytes (RPCs, files, the client config)
  quorum.kafka     Kafka's wire protocol on a node (``kraftkeeper start --kafka-listen``)
  quorum.timefmt   RFC 3339 timestamps, the one format every timestamp we write uses
  quorum.properties  Java .properties text (meta.properties, Kafka client files), read and written
  quorum.localports  free loopback ports for local clusters, chosen the way servers bind them
  quorum.polling   the one poll loop (wait for a named condition by a deadline), tests' too
  quorum.client    the HTTP client used by the CLI, the operator and the benchmarks
  quorum.cli       the `kraftkeeper` command line
  quorum.cliparse  the argument parser of every command line (usage errors as INVALID_REQUEST)
  quorum.describe_text  the tables `kraftkeeper quorum describe` prints
"""

__version__ = "0.1.0"
