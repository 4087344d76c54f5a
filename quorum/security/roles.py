"""The client roles a credential can carry and the default validity of issued certificates.

Apart from :mod:`quorum.security.pki` (which re-exports them) so that building the command line's
parser needs no X.509 library: ``kraftkeeper format`` and ``start`` import only what they run.
"""

from __future__ import annotations

ROLES = ("admin", "readwrite", "read")  # strongest first
LEAF_DAYS = 365  # node and client certificates, unless asked otherwise
