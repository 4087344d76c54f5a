"""Test doubles of the operator's ports (in-memory quorum): used by tests and benches only."""
