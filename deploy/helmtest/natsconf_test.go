//go:build unix

package helmtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The NATS chart writes nats.conf as pretty JSON in which a value given as
// "<< X >>" stands unquoted (a variable such as $SERVER_NAME) and a key
// ending in $include becomes an include directive.
var (
	jsonLine   = regexp.MustCompile(`^(\s*(?:"(?:[^"\\]|\\.)*":\s*)?)(.*?)(,?)\s*$`)
	rawQuoted  = regexp.MustCompile(`"<<\s+(.*?)\s+>>"`)
	includeDir = regexp.MustCompile(`(?m)^\s*include\s+`)
)

// quoteRaw turns the chart's pretty JSON with raw values ($VAR, 10Gi),
// one value a line, into JSON: a raw value becomes the string "<< X >>"
// that the chart was given.
func quoteRaw(conf string) string {
	lines := strings.Split(conf, "\n")
	for i, l := range lines {
		m := jsonLine.FindStringSubmatch(l)
		if m == nil || m[2] == "" || strings.ContainsAny(m[2][:1], `"{}[]`) || json.Valid([]byte(m[2])) {
			continue
		}
		lines[i] = m[1] + `"<< ` + m[2] + ` >>"` + m[3]
	}
	return strings.Join(lines, "\n")
}

// rewriteNATSConf rewrites a rendered nats.conf for a pod on loopback:
// each port of the pod to its loopback port, each address (the routes'
// pod DNS names) to the loopback ports standing in for it, each path under
// a volume mount (the store directory, the pid file) to the directory
// standing in for the volume, and each listener (the client port, which
// the monitoring port follows, the cluster port) on 127.0.0.1 where it
// would bind all the pod's interfaces. The rest is left as rendered.
func (c *cluster) rewriteNATSConf(p *runPod, ct corev1.Container, conf string) (string, error) {
	if includeDir.MatchString(conf) {
		return "", fmt.Errorf("nats.conf has include directives, which the test does not follow")
	}
	// Quote the raw values so the text is JSON, and unquote them after.
	js := quoteRaw(conf)
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
	return rawQuoted.ReplaceAllString(buf.String(), "$1"), nil
}
