"""``kraftkeeper demo``: a local quorum (or three real Kafka controllers) under the embedded
operator, disks replaced while writes go on, every acknowledged key checked, then the report.

Its own package because it drives both the operator (``kraftkeeper_operator.local``,
``kraftkeeper_operator.kafka``) and the report job (``kraftkeeper_reports``), which import
neither it nor each other's run modes: the demo sits above both.
"""
