"""KRaftKeeper recovery reports: the recovery event log (``events``, no Spark needed), a
realistic event generator (``generate``) and the PySpark report job (``job``).

Importing this package does not import PySpark: the operator uses ``events`` without Spark.
"""

from kraftkeeper_reports.events import EventLogWriter, validate_event

__all__ = ["EventLogWriter", "validate_event"]
