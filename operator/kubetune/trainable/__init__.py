"""Code that runs INSIDE a trial: ``api`` (report(), get_checkpoint(): what the user's
function calls), ``function_runner`` (the user's function in a thread, results queued
with sequence numbers), ``host`` (many trials in one worker process), ``pod_session``
(report() inside a trial pod), ``output`` (captured prints).  Checkpoint storage is
checkpoints/, which the operator uses too.

May import: spec/ (what a result may hold), checkpoints/ and the standard library; never
executors/, controller/ or k8s/: a trial's image needs kubetune and nothing of the
operator."""
