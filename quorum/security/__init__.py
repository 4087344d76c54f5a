"""Trust for KRaftKeeper: strict decoding of untrusted input, the per-cluster PKI,
bearer tokens, authentication and authorization of peers and clients, the TLS contexts and the
client config. Nothing here does I/O on the network itself; the runtime installs the pieces."""
