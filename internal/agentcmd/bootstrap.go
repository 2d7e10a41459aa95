package agentcmd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/switchyard-ai/switchyard/agent/engine/openai"
)

// discoverBootstrapPort reads an SGLang prefill engine's bootstrap port
// from its server info, waiting for the engine to come up (it may load
// weights for minutes). Advertising a guessed 8998 to decode agents made
// every PD request wait for a bootstrap that was never there.
func discoverBootstrapPort(ctx context.Context, oa *openai.Adapter, log *slog.Logger) (int, error) {
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := oa.SGLangInfo(ictx)
		cancel()
		if err == nil {
			if info.Mode != "" && info.Mode != "prefill" {
				log.Warn("the SGLang engine is not a prefill engine; start it with --disaggregation-mode prefill", "disaggregation_mode", info.Mode)
			}
			log.Info("bootstrap port read from the engine's server info", "bootstrap_port", info.BootstrapPort)
			return info.BootstrapPort, nil
		}
		log.Info("waiting for the SGLang engine's server info to learn its bootstrap port (--bootstrap-port skips this)", "err", err)
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("SGLang bootstrap port: %w", ctx.Err())
		case <-time.After(delay):
		}
	}
}

// bracketHost writes an IPv6 literal in brackets, as SGLang's own routers
// (mini_lb's maybe_wrap_ipv6_address) send bootstrap_host: the decode
// engine joins host and port as text, and "::1:8998" is no address.
func bracketHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if ip := net.ParseIP(h); ip != nil && ip.To4() == nil {
		return "[" + h + "]"
	}
	return h
}

// loopbackHost reports whether h (bracketed or not) names this host only.
func loopbackHost(h string) bool {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// remoteNATS reports whether any of the comma-separated NATS URLs names
// another host: then decode agents, and their engines, may be elsewhere.
func remoteNATS(urls string) bool {
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		p, err := url.Parse(u)
		if err != nil || !loopbackHost(p.Hostname()) {
			return true
		}
	}
	return false
}

// warnLoopbackBootstrap says loudly when a prefill agent advertises a
// loopback bootstrap host to a fleet that may span hosts: a decode engine
// on another node would dial itself and wait out its bootstrap timeout.
func warnLoopbackBootstrap(log *slog.Logger, host, natsURL string) bool {
	if !loopbackHost(host) || !remoteNATS(natsURL) {
		return false
	}
	log.Warn("SGLANG BOOTSTRAP HOST IS LOOPBACK: decode engines on other hosts cannot reach this prefill engine's bootstrap server; set --bootstrap-host to an address they can reach (or give --engine-url by that address)",
		"bootstrap_host", host, "nats_url", natsURL)
	return true
}
