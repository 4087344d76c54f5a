"""Property-based fuzzing of every decoder of untrusted bytes (Hypothesis)."""
