// Package fleetui is the broker's live fleet page: one HTML page, one
// script and one stylesheet embedded in the binary (no CDN, so it works
// offline and on an air-gapped cluster) that poll GET /v1/fleet and
// /metrics on the same origin every second and draw the capacity table as
// the dispatcher sees it: per model its pools, route weights, recent split
// and queue depth, every agent with its state and slow-start ramp, and
// charts of requests per second and mean time to first token.
//
// Handler serves the page at "/" and its assets under AssetPrefix
// ("/ui/"); mount it at both, e.g.
//
//	mux.Handle("GET /{$}", fleetui.Handler())
//	mux.Handle("GET /ui/", fleetui.Handler())
//
// The page fetches /v1/fleet and /metrics by absolute path, so it must be
// served by the broker (or a proxy forwarding those routes). When
// /v1/fleet answers 401 the page asks for an API key and sends it as a
// Bearer token, kept in the tab's sessionStorage only.
package fleetui
