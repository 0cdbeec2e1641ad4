// flux-health prints the health Flux's kustomize-controller computes for each object
// it reads as JSON on stdin (one object, or a List: `kubectl get -o json`) with the
// healthCheckExprs of a Flux Kustomization (its JSON in the file named by the only
// argument; the entry whose apiVersion and kind match the object is used).
// Output: one JSON line per object, {"name", "status", "message"}.
//
// It calls Flux's own evaluator (github.com/fluxcd/pkg/runtime/cel StatusEvaluator,
// RFC 0009): observedGeneration first, then inProgress, failed, current.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/fluxcd/pkg/apis/kustomize"
	"github.com/fluxcd/pkg/runtime/cel"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

type verdict struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: flux-health KUSTOMIZATION_JSON < objects.json"))
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	var kustomization struct {
		Spec struct {
			HealthCheckExprs []kustomize.CustomHealthCheck `json:"healthCheckExprs"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &kustomization); err != nil {
		fail(err)
	}
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var object unstructured.Unstructured
	if err := object.UnmarshalJSON(input); err != nil {
		fail(err)
	}
	items := []unstructured.Unstructured{object}
	if object.IsList() {
		list, err := object.ToList()
		if err != nil {
			fail(err)
		}
		items = list.Items
	}
	out := json.NewEncoder(os.Stdout)
	for i := range items {
		check := matching(kustomization.Spec.HealthCheckExprs, &items[i])
		if check == nil {
			fail(fmt.Errorf("%s: no healthCheckExprs entry for %s %s", items[i].GetName(),
				items[i].GetAPIVersion(), items[i].GetKind()))
		}
		evaluator, err := cel.NewStatusEvaluator(&check.HealthCheckExpressions)
		if err != nil {
			fail(err)
		}
		result, err := evaluator.Evaluate(context.Background(), &items[i])
		if err != nil {
			fail(fmt.Errorf("%s: %w", items[i].GetName(), err))
		}
		if err := out.Encode(verdict{items[i].GetName(), string(result.Status), result.Message}); err != nil {
			fail(err)
		}
	}
}

func matching(checks []kustomize.CustomHealthCheck, object *unstructured.Unstructured) *kustomize.CustomHealthCheck {
	for i := range checks {
		if checks[i].APIVersion == object.GetAPIVersion() && checks[i].Kind == object.GetKind() {
			return &checks[i]
		}
	}
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "flux-health:", err)
	os.Exit(1)
}
