"""The local run mode: ``kraftkeeper operator local`` (``operator``) supervises node processes
(``supervisor``) of a cluster directory (``cluster``) with TLS on by default (``tls``). It never
imports the Kubernetes run mode.
"""
