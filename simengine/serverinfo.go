package simengine

import (
	"encoding/json"
	"net/http"
)

// serverInfo serves GET /server_info (and its older name /get_server_info)
// as SGLang does, with the few server arguments a router or agent reads:
// the model, the disaggregation mode and, for an SGLang prefill engine,
// the bootstrap port (SGLang's --disaggregation-bootstrap-port).
func (e *Engine) serverInfo(w http.ResponseWriter, _ *http.Request) {
	mode := "null" // SGLang's value for a regular engine
	if e.cfg.Role == RolePrefill || e.cfg.Role == RoleDecode {
		mode = string(e.cfg.Role)
	}
	info := map[string]any{
		"model_path":          e.cfg.Model,
		"served_model_name":   e.cfg.Model,
		"disaggregation_mode": mode,
	}
	if e.cfg.Role == RolePrefill && e.cfg.PDProtocol == PDSGLang {
		info["disaggregation_bootstrap_port"] = e.BootstrapPort()
	}
	b, _ := json.Marshal(info)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
