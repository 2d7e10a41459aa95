package natsauth

import (
	"fmt"
	"net"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// ServerOptions loads a standard nats-server configuration file for the
// embedded server. Everything the file sets is NATS's own syntax and
// semantics (accounts, users, permissions, nkeys, operator JWTs and
// resolvers, TLS, cluster and leaf nodes); the caller fills in only what the
// file leaves unset. Environment variables referenced as $NAME in the file
// are resolved by nats-server, so passwords need not be written in it; an
// unset one is an error, never an empty password.
func ServerOptions(configFile string) (*server.Options, error) {
	if configFile == "" {
		return nil, fmt.Errorf("natsauth: no NATS configuration file given")
	}
	opts, err := server.ProcessConfigFile(configFile)
	if err != nil {
		return nil, fmt.Errorf("natsauth: NATS configuration %s: %w", configFile, err)
	}
	return opts, nil
}

// CheckExposure returns a warning, meant to be logged loudly at start,
// when opts let a server be reached from beyond this host without
// authentication, or with credentials crossing the network in plain text.
// It returns "" for a loopback-only server and for an exposed one with both
// authentication and TLS.
func CheckExposure(opts *server.Options) (warning string) {
	if opts == nil {
		return ""
	}
	var warns []string
	if !loopback(opts.Host) {
		listen := net.JoinHostPort(hostOrAll(opts.Host), portString(opts.Port))
		switch {
		case !hasClientAuth(opts):
			warns = append(warns, fmt.Sprintf("NATS listens on %s beyond loopback with NO authentication: anyone who can reach it can read every prompt and reply, publish jobs and forge heartbeats; configure users/nkeys/accounts (see deploy/nats/server.conf) or bind 127.0.0.1", listen))
		case opts.NoAuthUser != "":
			warns = append(warns, fmt.Sprintf("NATS listens on %s beyond loopback with no_auth_user %q: clients without credentials get that user's permissions", listen, opts.NoAuthUser))
		}
		if opts.TLSConfig == nil {
			warns = append(warns, fmt.Sprintf("NATS listens on %s beyond loopback without TLS: credentials, prompts and tokens cross the network in plain text", listen))
		}
	}
	if opts.Cluster.Port != 0 && !loopback(opts.Cluster.Host) && opts.Cluster.Username == "" && opts.Cluster.TLSConfig == nil {
		warns = append(warns, "NATS cluster routes listen beyond loopback with neither authorization nor TLS: any host can join the cluster")
	}
	if opts.LeafNode.Port != 0 && !loopback(opts.LeafNode.Host) && opts.LeafNode.Username == "" && len(opts.LeafNode.Users) == 0 && opts.LeafNode.TLSConfig == nil && len(opts.TrustedOperators) == 0 && len(opts.TrustedKeys) == 0 {
		warns = append(warns, "NATS leaf node port listens beyond loopback with neither authorization nor TLS")
	}
	if opts.HTTPPort != 0 && !loopback(opts.HTTPHost) {
		warns = append(warns, "NATS monitoring port listens beyond loopback: it shows connections, subjects and accounts to anyone")
	}
	if len(warns) == 0 {
		return ""
	}
	return "SECURITY WARNING: " + strings.Join(warns, "; ")
}

// hasClientAuth reports whether client connections must authenticate.
func hasClientAuth(opts *server.Options) bool {
	return len(opts.Users) > 0 ||
		len(opts.Nkeys) > 0 ||
		opts.Username != "" ||
		opts.Authorization != "" ||
		len(opts.TrustedOperators) > 0 ||
		len(opts.TrustedKeys) > 0 ||
		opts.AuthCallout != nil ||
		opts.CustomClientAuthentication != nil ||
		(opts.TLSVerify && opts.TLSMap)
}

// loopback reports whether host binds only this machine. The empty host is
// nats-server's default, every interface.
func loopback(host string) bool {
	h := strings.Trim(host, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func hostOrAll(host string) string {
	if host == "" {
		return "0.0.0.0"
	}
	return strings.Trim(host, "[]")
}

func portString(port int) string {
	switch {
	case port == 0:
		return "4222"
	case port < 0:
		return "random"
	}
	return fmt.Sprint(port)
}
