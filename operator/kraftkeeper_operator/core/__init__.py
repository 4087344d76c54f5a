"""The pure decision core of disk-failure recovery: no I/O, no clock, no Kubernetes.

It imports only itself (a test checks it): the recovery policy (``policy``), the recorded progress
(``records``), the leader's view (``view``), the voter-change guards (``guards``), the decision
book (``recovery``), what a pass publishes (``status``), certificate renewal order (``rotation``)
and the unclean-recovery survivor rule (``survivor``). The controller (``..controller``) executes
its decisions; the run modes (``..k8s``, ``..local``, ``..kafka``) only feed it.
"""
