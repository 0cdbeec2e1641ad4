"""The Argo CD health scripts ship twice (the chart's files/, examples/gitops/): the
copies must not drift.  What the scripts say is tested against Argo CD's own code in
tests/integration/test_gitops.py."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "charts" / "kubetune" / "files" / "argocd"


def test_the_argocd_cm_patch_holds_the_charts_scripts():
    data = yaml.safe_load((ROOT / "examples" / "gitops" / "argocd-cm-patch.yaml").read_text())["data"]
    assert data == {
        "resource.customizations.health.kubetune.dev_Experiment": (SCRIPTS / "experiment-health.lua").read_text(),
        "resource.customizations.health.kubetune.dev_Trial": (SCRIPTS / "trial-health.lua").read_text(),
    }


def test_the_chart_renders_both_scripts_under_the_switch():
    template = (ROOT / "charts" / "kubetune" / "templates" / "argocd-health.yaml").read_text()
    assert "if .Values.argocd.healthChecks.enabled" in template
    for kind, script in (("Experiment", "experiment-health.lua"), ("Trial", "trial-health.lua")):
        assert f"resource.customizations.health.kubetune.dev_{kind}: |" in template
        assert f'.Files.Get "files/argocd/{script}"' in template
    assert yaml.safe_load((ROOT / "charts" / "kubetune" / "values.yaml").read_text())["argocd"]["healthChecks"][
        "enabled"] is False
