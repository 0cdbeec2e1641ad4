"""Every Kubernetes API call, behind small typed functions: ``client`` (configuration,
the group/version constants), ``store`` (Experiments and Trials: the controller's
``Store``), ``pods`` (the pod executor's Pods, logs, Secrets, ConfigMaps, Events,
Nodes), ``lease`` (leader election), ``diffbase`` (kopf's storage), ``errors`` (the
exceptions callers see instead of the client's).

The only package (with the dev tools devcluster/ and bench/) that imports the
``kubernetes`` client.  May import: core/ (sanitising, leadership rules), metrics."""
