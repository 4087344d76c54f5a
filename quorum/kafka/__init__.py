"""Kafka wire protocol for the engine: Kafka's own message schemas (read from the cached Kafka jar) and the
``--kafka-listen`` server that lets Kafka's tools (``kafka-metadata-quorum``) read and change our quorum."""
