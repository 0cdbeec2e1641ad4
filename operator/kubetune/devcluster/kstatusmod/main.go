// kstatus prints what sigs.k8s.io/cli-utils' kstatus (the library Flux, kpt and
// `kubectl wait`-style tools use to read a resource's health) computes for each
// object it reads as JSON on stdin: one object, or a List (`kubectl get -o json`).
// Output: one JSON line per object, {"name", "status", "message"}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
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
		result, err := status.Compute(&items[i])
		if err != nil {
			fail(fmt.Errorf("%s: %w", items[i].GetName(), err))
		}
		if err := out.Encode(verdict{items[i].GetName(), string(result.Status), result.Message}); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(1)
}
