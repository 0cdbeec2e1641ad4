"""Code that runs INSIDE a trial: ``api`` (report(), get_checkpoint(): what the user's
function calls), ``function_runner`` (the user's function in a thread, results queued
with sequence numbers), ``host`` (many trials in one worker process), ``checkpoint``
(checkpoint storage: local paths and fsspec URIs), ``pod_session`` (report() inside a
trial pod), ``output`` (captured prints).

May import: spec/ (what a result may hold) and the standard library; never
executors/, controller/ or k8s/: a trial's image needs kubetune and nothing of the
operator."""
