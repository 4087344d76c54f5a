"""Apache Kafka controller quorums: the membership backend, its wire connection and a local runner."""
