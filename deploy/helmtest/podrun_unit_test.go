//go:build unix

package helmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestLoopbackRewrites: what the pods-as-processes test changes in a
// rendered command line or nats.conf, and what it leaves alone.
func TestLoopbackRewrites(t *testing.T) {
	docs := []string{`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: nats}
spec:
  replicas: 2
  serviceName: nats-headless
  selector: {matchLabels: {app: nats}}
  template:
    metadata: {labels: {app: nats}}
    spec:
      containers:
        - name: nats
          image: nats:2.12
          args: [--config, /etc/nats-config/nats.conf]
          ports:
            - {name: nats, containerPort: 4222}
            - {name: cluster, containerPort: 6222}
            - {name: monitor, containerPort: 8222}
          volumeMounts:
            - {name: config, mountPath: /etc/nats-config}
            - {name: pid, mountPath: /var/run/nats}
      volumes:
        - name: config
          configMap: {name: nats-config}
        - name: pid
          emptyDir: {}
`, `apiVersion: v1
kind: Service
metadata: {name: nats}
spec:
  selector: {app: nats}
  ports: [{name: nats, port: 4222, targetPort: nats}]
`, `apiVersion: v1
kind: Service
metadata: {name: nats-headless}
spec:
  clusterIP: None
  selector: {app: nats}
  ports: [{name: cluster, port: 6222, targetPort: cluster}]
`, `apiVersion: v1
kind: ConfigMap
metadata: {name: nats-config}
data:
  nats.conf: "{}"
`}
	var objs []object
	for _, d := range docs {
		o, err := decodeStrict(d)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	c := newCluster(t, nil, objs)
	pods := c.podsOf(c.workload("StatefulSet", "nats"))
	p0, p1 := pods[0], pods[1]
	at := func(p *runPod, port int32) string { return fmt.Sprintf("127.0.0.1:%d", p.port(t, port)) }

	for _, tt := range []struct{ in, want string }{
		{"nats://nats:4222", "nats://" + at(p0, 4222) + ",nats://" + at(p1, 4222)},
		{"nats://nats.sy.svc.cluster.local:4222", "nats://" + at(p0, 4222) + ",nats://" + at(p1, 4222)},
		{"nats://nats-1.nats-headless:6222", "nats://" + at(p1, 6222)},
		{"0.0.0.0:8222", at(p0, 8222)},
		{"http://127.0.0.1:9000", "http://" + at(p0, 9000)},
		{"example.com:443", "example.com:443"},
		{"30s", "30s"},
		{"kv=nixl", "kv=nixl"},
	} {
		if got := c.rewriteAddr(p0, tt.in); got != tt.want {
			t.Errorf("rewriteAddr(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}

	ct := p0.spec.Containers[0]
	args := c.rewriteArgs(p0, ct, ct.Args, nil)
	if want := filepath.Join(c.volume(p0, "config"), "nats.conf"); args[1] != want {
		t.Errorf("--config %q, want the ConfigMap's file %q", args[1], want)
	}

	conf := `{
  "cluster": {
    "name": "nats",
    "no_advertise": true,
    "port": 6222,
    "routes": [
      "nats://nats-0.nats-headless:6222",
      "nats://nats-1.nats-headless:6222"
    ]
  },
  "http_port": 8222,
  "jetstream": {
    "max_file_store": 10Gi,
    "max_memory_store": 0,
    "store_dir": "/var/run/nats/js"
  },
  "lame_duck_duration": "30s",
  "pid_file": "/var/run/nats/nats.pid",
  "port": 4222,
  "server_name": $SERVER_NAME,
  "users": [
    {
      "password": $SY_PW,
      "user": "broker"
    }
  ]
}`
	got, err := c.rewriteNATSConf(p0, ct, "/etc/nats-config/nats.conf", conf)
	if err != nil {
		t.Fatal(err)
	}
	pid := c.volume(p0, "pid")
	for _, want := range []string{
		fmt.Sprintf(`"port": %d`, p0.port(t, 4222)),
		fmt.Sprintf(`"port": %d`, p0.port(t, 6222)),
		fmt.Sprintf(`"http_port": %d`, p0.port(t, 8222)),
		`"nats://` + at(p0, 6222) + `"`, `"nats://` + at(p1, 6222) + `"`,
		`"pid_file": "` + pid + `/nats.pid"`, `"store_dir": "` + pid + `/js"`,
		`"server_name": $SERVER_NAME`, `"password": $SY_PW`,
		`"host": "127.0.0.1",
  "http_port"`, `"host": "127.0.0.1",
    "name"`,
		`"max_memory_store": 0`, `"max_file_store": 10Gi`, `"lame_duck_duration": "30s"`, `"no_advertise": true`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rewritten nats.conf lacks %s:\n%s", want, got)
		}
	}

	// Included files: a path relative to the config's, one under another
	// mount, as the chart writes them (a key ending in $include).
	got, err = c.rewriteNATSConf(p0, ct, "/etc/nats-config/nats.conf", `{
  include auth.conf;
  "port": 4222,
  include ../../var/run/nats/more.conf;
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"include auth.conf;",
		"include " + relPath(t, c.volume(p0, "config"), filepath.Join(pid, "more.conf")) + ";",
		fmt.Sprintf(`"port": %d`, p0.port(t, 4222)),
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rewritten nats.conf lacks %s:\n%s", want, got)
		}
	}
	// nats-server reads what the rewrite wrote.
	main := filepath.Join(c.volume(p0, "config"), "main.conf")
	for file, text := range map[string]string{
		main: got,
		filepath.Join(c.volume(p0, "config"), "auth.conf"): "max_payload: 4096\n",
		filepath.Join(pid, "more.conf"):                    "server_name: included\n",
	} {
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatalf("nats-server refuses the rewritten config: %v\n%s", err, got)
	}
	if opts.Port != p0.port(t, 4222) || opts.Host != "127.0.0.1" || opts.MaxPayload != 4096 || opts.ServerName != "included" {
		t.Errorf("nats-server read port %d host %s max_payload %d server_name %q from:\n%s", opts.Port, opts.Host, opts.MaxPayload, opts.ServerName, got)
	}
}

func relPath(t *testing.T, from, to string) string {
	rel, err := filepath.Rel(from, to)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}
