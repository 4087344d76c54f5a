"""What the tests (``tests/``) and the benchmarks (``bench/``) share, so that neither imports the
other's modules: the poll loop (:mod:`testkit.polling`), a cluster PKI in a directory
(:mod:`testkit.tls`), the test Kubernetes API server, etcd plus the pinned kube-apiserver
(:mod:`testkit.kubeapi`), the operator's commands as subprocesses, started and stopped one way
(:mod:`testkit.launchers`), and an older revision of this repository exported to run beside the
current code (:mod:`testkit.revision`). Free loopback ports come from the product's allocator,
:mod:`quorum.localports`. Nothing here imports ``tests`` or ``bench``.
"""
