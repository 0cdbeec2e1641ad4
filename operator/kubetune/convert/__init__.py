"""``kubetune convert``: an Experiment from what Ray Tune and Katib users already have
(issue 29).  ``raytune_capture`` runs a Tuner script with the Tuner intercepted (nothing
is tuned), ``raytune_map`` turns what it captured into an Experiment; ``katib`` turns a
Katib v1beta1 Experiment into one.  Whatever has no kubetune equivalent is refused by
name (``Refusal``), with where it came from; what maps only approximately is said in
a note at the head of the YAML.

May import: spec/ (to validate what it writes) and, for Ray Tune, the installed Ray.
"""
