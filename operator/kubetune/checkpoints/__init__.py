"""Checkpoint storage, used from both sides: inside a trial (trainable/: save, keep the
latest N, restore) and by the operator (controller/: PBT's copy of a donor's checkpoint,
deletion when an Experiment is done).  ``storage``: local paths and fsspec URIs.

May import: the standard library and fsspec only; nothing of kubetune, so a trial's
image and the controller can both use it without importing each other."""
