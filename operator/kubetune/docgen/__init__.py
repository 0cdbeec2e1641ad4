"""The reference pages of the documentation, generated from the sources they describe
so they cannot drift from them: the Experiment and Trial API from crds/*.yaml, the CLI
from its argparse parsers, the Helm values from the comments in values.yaml, the
metrics from the operator's Prometheus registry and the Events from the calls that
post them. Each function returns Markdown; ``mkdocs_hook`` adds the pages to the site
at build time (``make docs``), so nothing generated is committed.

Imports the CLI modules (argparse only) and ``kubetune.metrics``; nothing imports this.
"""
