package helmtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// object is one rendered manifest, decoded into the Go type of its kind.
type object struct {
	kind, name string
	source     string // the template that rendered it
	obj        any
}

// ServiceMonitor is the part of the Prometheus Operator's
// monitoring.coreos.com/v1 ServiceMonitor that the chart may set; any
// other field fails the strict decode.
type ServiceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// ScaledObject is the part of KEDA's keda.sh/v1alpha1 ScaledObject that
// the chart may set.
type ScaledObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace,omitempty"`
		Labels    map[string]string `json:"labels,omitempty"`
	} `json:"metadata"`
	Spec ScaledObjectSpec `json:"spec"`
}

// ScaledObjectSpec is the spec of a ScaledObject.
type ScaledObjectSpec struct {
	ScaleTargetRef struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Name       string `json:"name"`
	} `json:"scaleTargetRef"`
	MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
	MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
	PollingInterval *int32 `json:"pollingInterval,omitempty"`
	CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
	Triggers        []struct {
		Type     string            `json:"type"`
		Metadata map[string]string `json:"metadata"`
	} `json:"triggers"`
}

// newTyped returns the Go type an apiVersion and kind decode into.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 Pod":
		return &corev1.Pod{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &ServiceMonitor{}, nil
	case "keda.sh/v1alpha1 ScaledObject":
		return &ScaledObject{}, nil
	}
	return nil, fmt.Errorf("no Go type known for %s %s", apiVersion, kind)
}

var (
	docSep    = regexp.MustCompile(`(?m)^---\s*$`)
	sourceRe  = regexp.MustCompile(`(?m)^# Source: (\S+)`)
	onlySpace = regexp.MustCompile(`^(\s*#[^\n]*\n?|\s*)*$`)
)

// decodeAll splits helm's output into documents and decodes each strictly.
func decodeAll(t *testing.T, out string) []object {
	t.Helper()
	var objs []object
	for _, doc := range docSep.Split(out, -1) {
		if onlySpace.MatchString(doc) {
			continue
		}
		o, err := decodeStrict(doc)
		if err != nil {
			t.Errorf("%v\n%s", err, doc)
			continue
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 && !t.Failed() {
		t.Fatalf("helm rendered no object:\n%s", out)
	}
	return objs
}

// decodeStrict decodes one YAML document into the type of its kind:
// unknown fields fail, and so do a key given twice and a field whose name
// differs from the type's in case only (which encoding/json would accept).
func decodeStrict(doc string) (object, error) {
	src := ""
	if m := sourceRe.FindStringSubmatch(doc); m != nil {
		src = m[1]
	}
	js, err := yaml.YAMLToJSONStrict([]byte(doc)) // a key given twice fails
	if err != nil {
		return object{}, fmt.Errorf("%s: not YAML, or a key given twice: %v", src, err)
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(js, &head); err != nil {
		return object{}, fmt.Errorf("%s: %v", src, err)
	}
	typed, err := newTyped(head.APIVersion, head.Kind)
	if err != nil {
		return object{}, fmt.Errorf("%s: %v", src, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(typed); err != nil {
		return object{}, fmt.Errorf("%s: %s %s does not decode strictly: %v", src, head.Kind, head.Metadata.Name, err)
	}
	// Every key of the input must come back, spelled the same, when the
	// typed object is encoded again.
	var in, back any
	if err := json.Unmarshal(js, &in); err != nil {
		return object{}, err
	}
	again, err := json.Marshal(typed)
	if err != nil {
		return object{}, err
	}
	if err := json.Unmarshal(again, &back); err != nil {
		return object{}, err
	}
	if missing := missingKeys("", in, back); len(missing) > 0 {
		return object{}, fmt.Errorf("%s: %s %s: fields not in the API type as written: %s", src, head.Kind, head.Metadata.Name, strings.Join(missing, ", "))
	}
	return object{kind: head.Kind, name: head.Metadata.Name, source: src, obj: typed}, nil
}

// missingKeys lists the key paths of in that out lacks. A key whose value
// is null, empty or zero may be dropped by omitempty and is not counted.
func missingKeys(path string, in, out any) []string {
	var missing []string
	switch iv := in.(type) {
	case map[string]any:
		om, _ := out.(map[string]any)
		keys := make([]string, 0, len(iv))
		for k := range iv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ov, ok := om[k]
			if !ok {
				if !isZero(iv[k]) {
					missing = append(missing, path+"."+k)
				}
				continue
			}
			missing = append(missing, missingKeys(path+"."+k, iv[k], ov)...)
		}
	case []any:
		ol, _ := out.([]any)
		for i, v := range iv {
			if i < len(ol) {
				missing = append(missing, missingKeys(fmt.Sprintf("%s[%d]", path, i), v, ol[i])...)
			}
		}
	}
	return missing
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	}
	return false
}

// TestDecodeStrictCatches makes sure the decoder refuses the mistakes it
// exists for.
func TestDecodeStrictCatches(t *testing.T) {
	good := `apiVersion: v1
kind: Service
metadata:
  name: s
spec:
  ports:
    - port: 80
`
	if _, err := decodeStrict(good); err != nil {
		t.Fatalf("a valid Service: %v", err)
	}
	for _, tt := range []struct{ name, doc string }{
		{"unknown field", strings.Replace(good, "- port: 80", "- port: 80\n      prot: TCP", 1)},
		{"field in the wrong case", strings.Replace(good, "- port: 80", "- Port: 80", 1)},
		{"wrong type", strings.Replace(good, "- port: 80", "- port: eighty", 1)},
		{"unknown kind", strings.Replace(good, "kind: Service", "kind: Servce", 1)},
		{"key given twice", strings.Replace(good, "  name: s", "  name: s\n  name: t", 1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := decodeStrict(tt.doc); err == nil {
				t.Errorf("accepted:\n%s", tt.doc)
			} else {
				t.Logf("refused: %v", err)
			}
		})
	}
}
