"""The pod platform (``spec.executor: pod``): ``executor.PodExecutor`` (the
``TrialExecutor``), ``listing`` (an Experiment's pods as last read, with what Kueue and
the cluster autoscaler say of them), ``trial_objects`` (a trial's Secret and ConfigMap),
``capacity`` (what the nodes hold), ``spec`` (renders the Pod, Secret and ConfigMap of a
trial, and the environment of a trial's process),
``ingest`` + ``ingest_http`` (the bounded HTTP endpoint pods push results to),
``logs`` + ``stdout_results`` (results read from the pod's log), ``cluster`` (the
handle the controller uses in place of a Ray cluster's, and the operator-wide wiring).

May import: executors.base, k8s/ (every API call is in k8s/pods.py), spec/, core/.
Never the Kubernetes client itself (tests/unit/test_seams.py)."""
