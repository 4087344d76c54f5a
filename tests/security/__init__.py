"""Trust groundwork: PKI, credentials, authorization, strict decoding (issue 8)."""
