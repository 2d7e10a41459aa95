//go:build unix

package helmtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The NATS chart writes nats.conf as pretty JSON in which a value given as
// "<< X >>" stands unquoted (a variable such as $SERVER_NAME, a size such
// as 10Gi) and a key ending in $include becomes an include directive.
var (
	jsonLine      = regexp.MustCompile(`^(\s*(?:"(?:[^"\\]|\\.)*":\s*)?)(.*?)(,?)\s*$`)
	includeLine   = regexp.MustCompile(`^(\s*)include\s+["']?(.*?)["']?\s*;?\s*$`)
	trailingComma = regexp.MustCompile(`,(\s*[}\]])`)
	rawQuoted     = regexp.MustCompile(`"<<\s+(.*?)\s+>>"`)
	includeKey    = regexp.MustCompile(`(?m)^(\s*)"\$include\d+": "(.*)",?$`)
)

// toJSON turns the chart's form of nats.conf, one value a line, into JSON:
// a raw value becomes the string "<< X >>" that the chart was given, an
// include directive a key "$include<n>" whose value is the path.
func toJSON(conf string) string {
	lines := strings.Split(conf, "\n")
	for i, l := range lines {
		if m := includeLine.FindStringSubmatch(l); m != nil {
			path, _ := json.Marshal(m[2])
			lines[i] = fmt.Sprintf("%s\"$include%d\": %s,", m[1], i, path)
			continue
		}
		m := jsonLine.FindStringSubmatch(l)
		if m == nil || m[2] == "" || strings.ContainsAny(m[2][:1], `"{}[]`) || json.Valid([]byte(m[2])) {
			continue
		}
		lines[i] = m[1] + `"<< ` + m[2] + ` >>"` + m[3]
	}
	return trailingComma.ReplaceAllString(strings.Join(lines, "\n"), "$1")
}

// fromJSON is the inverse of toJSON.
func fromJSON(js string) string {
	return includeKey.ReplaceAllString(rawQuoted.ReplaceAllString(js, "$1"), "${1}include ${2};")
}

// rewriteNATSConf rewrites a rendered nats.conf for a pod on loopback:
// each port of the pod to its loopback port, each address (the routes'
// pod DNS names) to the loopback ports standing in for it, each path under
// a volume mount (the store directory, the pid file) to the directory
// standing in for the volume, and each listener (the client port, which
// the monitoring port follows, the cluster port) on 127.0.0.1 where it
// would bind all the pod's interfaces. The rest is left as rendered.
//
// confPath is where the container reads the file: an included file's path
// is relative to it.
func (c *cluster) rewriteNATSConf(p *runPod, ct corev1.Container, confPath, conf string) (string, error) {
	js := toJSON(conf)
	dec := json.NewDecoder(strings.NewReader(js))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return "", fmt.Errorf("nats.conf is not the chart's JSON form: %v\n%s", err, js)
	}
	var walk func(key string, v any) any
	walk = func(key string, v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = walk(k, e)
			}
			// A listener (the server's own, the cluster's, ...) binds the
			// pod's interfaces: here loopback only.
			if _, ok := x["port"]; ok {
				if h, _ := x["host"].(string); h == "" || h == "0.0.0.0" || h == "::" {
					x["host"] = "127.0.0.1"
				}
			}
		case []any:
			for i, e := range x {
				x[i] = walk(key, e)
			}
		case json.Number:
			if n, err := strconv.Atoi(x.String()); err == nil && strings.HasSuffix(key, "port") && p.hasPort(int32(n)) {
				return json.Number(strconv.Itoa(p.port(c.t, int32(n))))
			}
		case string:
			if strings.HasPrefix(x, "<<") {
				return x
			}
			if strings.HasPrefix(key, "$include") {
				// nats-server reads an include relative to the including
				// file's directory, even a path starting with /.
				from := filepath.Dir(c.hostPath(p, ct, confPath))
				to := c.hostPath(p, ct, path.Join(path.Dir(confPath), x))
				if rel, err := filepath.Rel(from, to); err == nil {
					return rel
				}
				return x
			}
			x = c.rewriteAddr(p, x)
			return c.hostPath(p, ct, x)
		}
		return v
	}
	walk("", doc)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return "", err
	}
	return fromJSON(buf.String()), nil
}
