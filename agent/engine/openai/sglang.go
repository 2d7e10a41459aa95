package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// SGLangServerInfo is what the agent reads from an SGLang engine's server
// info: its bootstrap port and disaggregation mode.
type SGLangServerInfo struct {
	BootstrapPort int
	Mode          string // "prefill", "decode" or "null"
}

// ErrNoServerInfo: the engine answered neither /server_info nor
// /get_server_info with a bootstrap port (not SGLang, or too old).
var ErrNoServerInfo = errors.New("engine reports no disaggregation_bootstrap_port in /server_info or /get_server_info")

// SGLangInfo asks an SGLang engine for its server info: /server_info, or
// /get_server_info on releases before it was renamed. Both answer the
// engine's server arguments at the top level, among them
// disaggregation_bootstrap_port (--disaggregation-bootstrap-port) and
// disaggregation_mode.
func (a *Adapter) SGLangInfo(ctx context.Context) (SGLangServerInfo, error) {
	var last error = ErrNoServerInfo
	for _, path := range []string{"/server_info", "/get_server_info"} {
		info, err := a.sglangInfo(ctx, path)
		if err == nil {
			return info, nil
		}
		last = err
		var we interface{ GetHttpStatus() uint32 }
		if errors.As(err, &we) && (we.GetHttpStatus() == http.StatusNotFound || we.GetHttpStatus() == http.StatusMethodNotAllowed) {
			continue // try the older name
		}
		if !errors.Is(err, ErrNoServerInfo) {
			return SGLangServerInfo{}, err // unreachable, unauthorized: say so
		}
	}
	return SGLangServerInfo{}, last
}

func (a *Adapter) sglangInfo(ctx context.Context, path string) (SGLangServerInfo, error) {
	req, err := a.newRequest(ctx, http.MethodGet, path, nil)
	if err != nil {
		return SGLangServerInfo{}, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return SGLangServerInfo{}, fmt.Errorf("engine %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return SGLangServerInfo{}, statusError(resp)
	}
	type fields struct {
		Port *int   `json:"disaggregation_bootstrap_port"`
		Mode string `json:"disaggregation_mode"`
	}
	var body struct {
		fields
		ServerArgs *fields `json:"server_args"` // as some builds nest them
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&body); err != nil {
		return SGLangServerInfo{}, fmt.Errorf("engine %s: %w", path, err)
	}
	f := body.fields
	if f.Port == nil && body.ServerArgs != nil {
		f = *body.ServerArgs
	}
	if f.Port == nil || *f.Port <= 0 || *f.Port > 65535 {
		return SGLangServerInfo{}, fmt.Errorf("%w (%s answered without it)", ErrNoServerInfo, path)
	}
	return SGLangServerInfo{BootstrapPort: *f.Port, Mode: f.Mode}, nil
}
