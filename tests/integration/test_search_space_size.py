"""A search space over the limit is refused at `kubectl apply` by the chart's
ValidatingAdmissionPolicy, naming spec.searchSpace, against the real API server; an
Experiment stored before the policy (or where it is off) still deletes (issue 21.4).

The policy is rendered from charts/kubetune with `helm template` and bound to the test's
namespace only (watchNamespaces), so other tests on the same API server are untouched."""
from __future__ import annotations

import json
import uuid

import pytest
import yaml

from kube_fixtures import wait_for
from test_chart import helm, render  # noqa: F401 (helm: fixture)
from kubetune.spec import parse_experiment
from kubetune.spec.model import SpecError
from kubetune.spec.search_space import MAX_SEARCH_SPACE_SIZE, search_space_size

pytestmark = pytest.mark.integration

TOO_LARGE = "spec.searchSpace: is too large"


def space_of_size(size: int) -> dict:
    """A search space whose search_space_size is exactly ``size``: names p00, p01, ... each
    with up to 256 choice strings of up to 200 characters."""
    space: dict[str, dict] = {}
    left = size
    while left > 0:
        name = f"p{len(space):02d}"
        left -= len(name) + 32
        choices = []
        while left > 0 and len(choices) < 256:
            text = f"{len(choices)}-" + "v" * 200
            text = text[:max(1, min(len(text), left))]
            choices.append(text)
            left -= len(text)
        space[name] = {"choice": choices}
    assert left == 0 and search_space_size(space) == size, (left, search_space_size(space))
    return space


def manifest(name: str, space: dict, finalizers: list[str] | None = None) -> dict:
    return {"apiVersion": "kubetune.dev/v1alpha1", "kind": "Experiment",
            "metadata": {"name": name, **({"finalizers": finalizers} if finalizers else {})},
            "spec": {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": space,
                     "trial": {"entrypoint": "m:f"}}}


@pytest.fixture
def size_policy(helm, kubectl, namespace, tmp_path):  # noqa: F811 (helm: fixture)
    """The chart's search-space policy and its binding, bound to ``namespace``; removed after."""
    release = f"sz{uuid.uuid4().hex[:8]}"
    documents = [d for d in render(helm, tmp_path, release, "kubetune-system", {"watchNamespaces": [namespace]})
                 if d["kind"].startswith("ValidatingAdmissionPolicy")
                 and d["metadata"]["name"].endswith("-search-space-size")]
    assert sorted(d["kind"] for d in documents) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    body = "\n---\n".join(yaml.safe_dump(d) for d in documents)
    yield lambda: kubectl("apply", "-f", "-", input=body)
    kubectl("delete", "--ignore-not-found", "-f", "-", input=body)


def refusal(kubectl, namespace: str, body: dict, *args: str) -> str:
    """stderr of a refused `kubectl <args>` of ``body`` ("" when accepted)."""
    done = kubectl(*args, "-n", namespace, "-f", "-", input=json.dumps(body), check=False)
    return done.stderr if done.returncode != 0 else ""


def test_an_oversize_search_space_is_refused_at_apply_and_a_stored_one_still_deletes(
        kubectl, namespace, size_policy):
    over, limit = space_of_size(MAX_SEARCH_SPACE_SIZE + 1), space_of_size(MAX_SEARCH_SPACE_SIZE)
    # stored before the policy, with a finalizer as the operator puts one
    kubectl("create", "-n", namespace, "-f", "-",
            input=json.dumps(manifest("stored", over, finalizers=["kubetune.dev/finalizer"])))
    size_policy()
    # a new policy takes effect within seconds: wait until it refuses
    wait_for(lambda: TOO_LARGE in refusal(kubectl, namespace, manifest("probe", over), "create", "--dry-run=server"),
             timeout=60, interval=0.5, message="the search-space size policy to take effect")

    # the user's path: kubectl apply (client-side: kubectl also copies the object into an
    # annotation, which fits, so the message is about the search space alone)
    refused = refusal(kubectl, namespace, manifest("big", over), "apply")
    assert TOO_LARGE in refused and "KiB (at most 128 KiB" in refused and "sample from ranges" in refused, refused
    assert "metadata.annotations" not in refused, refused
    # the API server's sum is spec/parse.py's, to the character: the limit itself is accepted
    assert refusal(kubectl, namespace, manifest("big", limit), "apply") == ""
    with pytest.raises(SpecError, match="is too large"):
        parse_experiment(manifest("big", over)["spec"])
    parse_experiment(manifest("big", limit)["spec"])
    # ordinal values count too, 8 each, as the parser counts them: 64 lists of 256 numbers
    ordinals = {f"p{i:02d}": {"ordinal": list(range(256))} for i in range(64)}
    assert search_space_size(ordinals) > MAX_SEARCH_SPACE_SIZE
    refused = refusal(kubectl, namespace, manifest("ordinals", ordinals), "create", "--dry-run=server")
    assert TOO_LARGE in refused and "ordinal value" in refused, refused
    # growing an accepted search space over the limit is refused too
    patch = {"spec": {"searchSpace": {"zz": {"choice": ["w" * 200] * 5}}}}
    grown = kubectl("patch", "-n", namespace, "experiment", "big", "--type=merge", "-p", json.dumps(patch),
                    check=False)
    assert grown.returncode != 0 and TOO_LARGE in grown.stderr, grown.stderr

    # the Experiment stored over the limit: updates that keep its search space go through
    # (the operator's finalizer patch), so `kubectl delete` completes
    kubectl("label", "-n", namespace, "experiment", "stored", "touched=yes")
    kubectl("delete", "-n", namespace, "experiment", "stored", "--wait=false")
    kubectl("patch", "-n", namespace, "experiment", "stored", "--type=json",
            "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]))
    wait_for(lambda: kubectl("get", "-n", namespace, "experiment", "stored", check=False).returncode != 0,
             timeout=60, interval=0.5, message="the oversize Experiment to be deleted")


def test_a_search_space_over_kubectls_annotation_limit_is_refused_naming_it_server_side(
        kubectl, namespace, size_policy):
    size_policy()
    huge = manifest("huge", space_of_size(300 * 1024))
    wait_for(lambda: TOO_LARGE in refusal(kubectl, namespace, huge, "create", "--dry-run=server"),
             timeout=60, interval=0.5, message="the search-space size policy to take effect")
    refused = refusal(kubectl, namespace, huge, "apply", "--server-side")
    assert TOO_LARGE in refused, refused
