"""Tests of quorum.storage: real files and fsync, plus the in-memory twins."""
