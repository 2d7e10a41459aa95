// Package natsauth holds Switchyard's NATS security settings: the client
// flags every command shares (credentials, nkeys, user/password, token and
// TLS) turned into nats.go options, and the embedded server's configuration
// loaded from a standard nats-server configuration file, so accounts, users,
// permissions, nkeys, JWT resolvers and TLS work exactly as NATS documents
// them. deploy/nats/server.conf is the least-privilege example that the
// tests of this package run against.
package natsauth
