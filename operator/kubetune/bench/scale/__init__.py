"""The scale benchmark of issue 26 (``python -m kubetune.bench.scale``, ``make bench``):
many Experiments across many namespaces, one big Experiment, and an operator SIGKILL
and restart half way, on the real API server, the real operator and real local Ray.

Modules (the integration test ``tests/integration/test_scale.py`` uses the same ones):

- ``shapes``: what is applied (the Experiments of the ``many`` and ``big`` shapes);
- ``trials``: the trial function, which also keeps a ledger of its runs on disk;
- ``observe``: applies the Experiments and watches Experiments and Trials (one watch
  each, cluster-wide), recording when each was seen in which phase;
- ``checks``: nothing lost or duplicated (Trials, indices, results, runs);
- ``fairness``: each Experiment's and namespace's share of capacity, and how long an
  Experiment waited for a slot counted in other trials' completions (pure);
- ``apimetrics``, ``procstat``: the apiserver's ``/metrics`` and the operator's /proc;
- ``harness``: one run (control plane, Ray, operator, kill and restart);
- ``report``: the JSON and the Markdown table.
"""
