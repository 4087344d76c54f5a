"""The Kubernetes run mode: the kopf handlers (``handlers``, run by ``kopf_main``), the
per-KRaftQuorum work (``quorums``, ``kafkaquorums`` for ``spec.kafka``), every API call (``kube``),
the objects as plain dicts (``manifests``, ``tlsspec``, ``tlsobjects``), TLS work (``quorumtls``),
ownership (``ownership``, ``kafkaownership``), pods (``podwatch``, ``podhealth``) and KIP-704
unclean recovery (``unclean``). It never imports the local run mode.
"""
