package helmtest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"sigs.k8s.io/yaml"

	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// natsChartValues is the part of the NATS chart's values that
// deploy/helm/nats-values.yaml sets.
type natsChartValues struct {
	Config struct {
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				PVC struct {
					Size string `json:"size"`
				} `json:"pvc"`
			} `json:"fileStore"`
		} `json:"jetstream"`
		Monitor struct {
			Enabled bool `json:"enabled"`
		} `json:"monitor"`
		Merge map[string]any `json:"merge"`
	} `json:"config"`
	Container struct {
		Env map[string]struct {
			ValueFrom struct {
				SecretKeyRef struct {
					Name string `json:"name"`
					Key  string `json:"key"`
				} `json:"secretKeyRef"`
			} `json:"valueFrom"`
		} `json:"env"`
	} `json:"container"`
}

// The NATS chart writes a value "<< X >>" into nats.conf as X, unquoted:
// how a config refers to an environment variable.
var literal = regexp.MustCompile(`"<< *(\$[A-Z0-9_]+) *>>"`)

// TestNATSValues loads the NATS chart's merge block into nats-server as
// the chart would write it, and compares its users and permissions with
// deploy/nats/server.conf's: the same account, the agents' permissions
// unchanged, the broker's in the form for a group of brokers sharing one
// user. Every password is a variable that the chart's container reads from
// the Secret the Switchyard chart reads too.
func TestNATSValues(t *testing.T) {
	root := cmdtest.RepoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "nats-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var v natsChartValues
	if err := json.Unmarshal(js, &v); err != nil {
		t.Fatal(err)
	}
	c := v.Config
	if !c.Cluster.Enabled || c.Cluster.Replicas != 3 || !c.JetStream.Enabled || c.JetStream.FileStore.PVC.Size == "" || !c.Monitor.Enabled {
		t.Errorf("config %+v: want a 3-node JetStream cluster on volumes, with monitoring for KEDA", c)
	}
	if want := defaults.jobsReplicas; want != "3" {
		t.Errorf("the chart's jobs stream replicas %s differ from the cluster's 3 nodes", want)
	}

	// The passwords: variables, each from the Secret under its user's name.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep "<< $VAR >>" as written
	if err := enc.Encode(c.Merge); err != nil {
		t.Fatal(err)
	}
	merge := buf.Bytes()
	vars := literal.FindAllStringSubmatch(string(merge), -1)
	if len(vars) != 5 {
		t.Errorf("%d variables in the merge block, want one password per user", len(vars))
	}
	for _, m := range vars {
		name := strings.TrimPrefix(m[1], "$")
		e, ok := v.Container.Env[name]
		if !ok || e.ValueFrom.SecretKeyRef.Name != defaults.secret {
			t.Errorf("%s: not read from Secret %s (env %+v)", name, defaults.secret, e)
		}
		t.Setenv(name, "pw-"+e.ValueFrom.SecretKeyRef.Key)
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(literal.ReplaceAllString(string(merge), "$1")), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses the merge block: %v", err)
	}
	if got.MaxPayload < brokercmd.DefaultMaxPayload {
		t.Errorf("max_payload %d is below the broker's %d", got.MaxPayload, brokercmd.DefaultMaxPayload)
	}

	// The project's configuration, with its passwords.
	refPath := filepath.Join(root, "deploy", "nats", "server.conf")
	refText, err := os.ReadFile(refPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$(SY_NATS_[A-Z_]+_PASSWORD)`).FindAllStringSubmatch(string(refText), -1) {
		if os.Getenv(m[1]) == "" {
			t.Setenv(m[1], "x")
		}
	}
	ref, err := server.ProcessConfigFile(refPath)
	if err != nil {
		t.Fatal(err)
	}
	refUsers := map[string]*server.User{}
	for _, u := range ref.Users {
		// The system account is the NATS chart's own (its systemAccount),
		// not one of the SWITCHYARD users this file carries.
		if u.Account != nil && u.Account.Name == ref.SystemAccount {
			continue
		}
		refUsers[u.Username] = u
	}
	// The broker group's user: broker-1's permissions with its id made a
	// wildcard (deploy/nats/README.md, "More brokers").
	if b, ok := refUsers["broker-1"]; ok {
		group := map[string]string{
			"sy.reply.broker-1.*":   "sy.reply.*.*",
			"_INBOX.broker-1.>":     "_INBOX.broker.>",
			"sy.learn.*.*.broker-1": "sy.learn.*.*.*",
		}
		sub := func(l []string) []string {
			out := slices.Clone(l)
			for i, s := range out {
				if r, ok := group[s]; ok {
					out[i] = r
				}
			}
			return out
		}
		refUsers["broker"] = &server.User{Username: "broker", Account: b.Account, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: sub(b.Permissions.Publish.Allow)},
			Subscribe: &server.SubjectPermission{Allow: sub(b.Permissions.Subscribe.Allow)},
		}}
		delete(refUsers, "broker-1")
	} else {
		t.Fatal("deploy/nats/server.conf has no broker-1")
	}

	seen := map[string]bool{}
	for _, u := range got.Users {
		seen[u.Username] = true
		r, ok := refUsers[u.Username]
		if !ok {
			t.Errorf("user %s is not one of deploy/nats's", u.Username)
			continue
		}
		if u.Account == nil || r.Account == nil || u.Account.Name != r.Account.Name {
			t.Errorf("user %s: account %v, want %v", u.Username, u.Account, r.Account)
		}
		if u.Password != "pw-"+u.Username {
			t.Errorf("user %s: the password is not the Secret's key %s", u.Username, u.Username)
		}
		for _, dir := range []struct {
			name      string
			got, want *server.SubjectPermission
		}{
			{"publish", u.Permissions.Publish, r.Permissions.Publish},
			{"subscribe", u.Permissions.Subscribe, r.Permissions.Subscribe},
		} {
			g, w := slices.Sorted(slices.Values(dir.got.Allow)), slices.Sorted(slices.Values(dir.want.Allow))
			if !slices.Equal(g, w) || len(dir.got.Deny) != len(dir.want.Deny) {
				t.Errorf("user %s %s: allow %q, want %q", u.Username, dir.name, g, w)
			}
		}
	}
	for name := range refUsers {
		if !seen[name] {
			t.Errorf("user %s of deploy/nats is missing", name)
		}
	}
	if got.NoAuthUser != "" {
		t.Errorf("no_auth_user %q: a client without credentials must be refused", got.NoAuthUser)
	}
	// The Switchyard chart's default NATS users are these.
	for _, u := range []string{"broker", "agent-regular", "agent-prefill", "agent-decode"} {
		if !seen[u] {
			t.Errorf("the chart's NATS user %s is not in nats-values.yaml", u)
		}
	}
}
