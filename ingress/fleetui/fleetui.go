package fleetui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// AssetPrefix is the path under which Handler serves the page's script and
// stylesheet; index.html refers to them by absolute path below it.
const AssetPrefix = "/ui/"

//go:embed assets/index.html assets/fleet.js assets/fleet.css
var assets embed.FS

// contentSecurityPolicy allows only the page's own assets and same-origin
// fetches: the page needs nothing else, and an injected agent id or model
// name could not load a script even if escaping failed.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
}

// Handler serves the fleet page at "/" (and at AssetPrefix itself) and its
// assets at AssetPrefix+"fleet.js" and AssetPrefix+"fleet.css". Any other
// path is 404; methods other than GET and HEAD are 405.
func Handler() http.Handler {
	return http.HandlerFunc(serve)
}

func serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := assetName(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	body, err := fs.ReadFile(assets, "assets/"+name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", types[name[strings.LastIndexByte(name, '.'):]])
	// The page changes with the broker binary; no-cache keeps a rollout
	// from pairing an old script with a new fleet format.
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if name == "index.html" {
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body)
}

// assetName maps a request path to an embedded file name.
func assetName(p string) (string, bool) {
	switch p {
	case "", "/", AssetPrefix, AssetPrefix + "index.html":
		return "index.html", true
	case AssetPrefix + "fleet.js":
		return "fleet.js", true
	case AssetPrefix + "fleet.css":
		return "fleet.css", true
	}
	return "", false
}
