// Package helmtest checks the Helm chart in deploy/helm/switchyard without
// a Kubernetes cluster. It builds helm (v4) from the Go module proxy once
// per version into the user's cache directory, runs helm lint and helm
// template on the default values and on every file of the chart's
// examples/, and decodes every rendered object strictly into its
// Kubernetes API type. Then it checks what a cluster would only show at
// run time: every command line against the real commands' flags, the
// probes against the paths the broker and agent serve (by running them
// with the rendered arguments), grace periods against drain timeouts and
// the readiness probe against the shutdown delay, Pod Security
// "restricted" on every pod, GOMEMLIMIT against the memory limits, the
// agent's engine on localhost, NATS passwords from Secrets only, images
// from values, the KEDA queries against the broker's metrics and the
// target pools' agents, and the official NATS chart rendered with
// deploy/helm/nats-values.yaml: its configuration against
// deploy/nats/server.conf, loaded into nats-server with bcrypt hashes,
// reloaded, and serving the broker and agents the chart renders.
//
// TestChartsAsProcesses runs both charts without a cluster: the official
// NATS chart's pods as nats-server processes on their rendered nats.conf,
// the brokers and agents as the real commands with their rendered command
// lines and environment, sim-engines for the engines, everything on
// loopback; it serves chat and PD through every broker, then loses a NATS
// server and a broker and serves again.
package helmtest
