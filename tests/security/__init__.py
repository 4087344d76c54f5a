"""Trust groundwork: PKI, credentials, authorization, strict decoding."""
