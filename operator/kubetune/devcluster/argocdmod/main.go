// argocd-health prints the health Argo CD itself computes for each object it reads as
// JSON on stdin (one object, or a List: `kubectl get -o json`), with the health
// customizations of an argocd-cm ConfigMap (its JSON in the file named by the only
// argument).  Output: one JSON line per object, {"name", "status", "message"}.
//
// It calls the code Argo CD's application controller calls: gitops-engine's
// health.GetResourceHealth with argo-cd's Lua health overrides (util/lua), so the
// scripts run in Argo CD's own Lua VM set-up (no string library, a 1 s timeout).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/gitops-engine/pkg/health"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const healthKeyPrefix = "resource.customizations.health."

type verdict struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: argocd-health ARGOCD_CM_JSON < objects.json"))
	}
	overrides, err := healthOverrides(os.Args[1])
	if err != nil {
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
		result, err := health.GetResourceHealth(&items[i], overrides)
		if err != nil {
			fail(fmt.Errorf("%s: %w", items[i].GetName(), err))
		}
		if result == nil {
			result = &health.HealthStatus{}   // Argo CD shows no health for such a resource
		}
		if err := out.Encode(verdict{items[i].GetName(), string(result.Status), result.Message}); err != nil {
			fail(err)
		}
	}
}

// healthOverrides reads the resource.customizations.health.<group>_<kind> keys of an
// argocd-cm ConfigMap the way argo-cd's util/settings does (convertToOverrideKey):
// "<group>_<kind>" names the override "<group>/<kind>".
func healthOverrides(path string) (lua.ResourceHealthOverrides, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var configMap struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(raw, &configMap); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	overrides := lua.ResourceHealthOverrides{}
	for key, script := range configMap.Data {
		if !strings.HasPrefix(key, healthKeyPrefix) {
			continue
		}
		groupKind := strings.TrimPrefix(key, healthKeyPrefix)
		parts := strings.Split(groupKind, "_")
		if len(parts) == 2 {
			groupKind = parts[0] + "/" + parts[1]
		} else if len(parts) != 1 || groupKind == "" {
			return nil, fmt.Errorf("%s: bad key %q", path, key)
		}
		overrides[groupKind] = v1alpha1.ResourceOverride{HealthLua: script}
	}
	if len(overrides) == 0 {
		return nil, fmt.Errorf("%s: no %s* key in data", path, healthKeyPrefix)
	}
	return overrides, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "argocd-health:", err)
	os.Exit(1)
}
