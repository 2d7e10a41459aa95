package dispatch_test

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

func TestParseRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		parse func(string) (string, error) // parse then String
	}{
		{name: "pool regular", text: "regular", parse: parseString(dispatch.ParsePool)},
		{name: "pool prefill", text: "prefill", parse: parseString(dispatch.ParsePool)},
		{name: "pool decode", text: "decode", parse: parseString(dispatch.ParsePool)},
		{name: "state warming", text: "warming", parse: parseString(dispatch.ParseState)},
		{name: "state ready", text: "ready", parse: parseString(dispatch.ParseState)},
		{name: "state draining", text: "draining", parse: parseString(dispatch.ParseState)},
		{name: "mode capacity", text: "capacity", parse: parseString(dispatch.ParseMode)},
		{name: "mode paired", text: "paired", parse: parseString(dispatch.ParseMode)},
		{name: "mode count", text: "count", parse: parseString(dispatch.ParseMode)},
		{name: "mode slo", text: "slo", parse: parseString(dispatch.ParseMode)},
		{name: "mode threshold", text: "threshold", parse: parseString(dispatch.ParseMode)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parse(tt.text)
			if err != nil || got != tt.text {
				t.Errorf("parse(%q).String() = %q, %v", tt.text, got, err)
			}
		})
	}
}

func parseString[T interface{ String() string }](parse func(string) (T, error)) func(string) (string, error) {
	return func(s string) (string, error) {
		v, err := parse(s)
		if err != nil {
			return "", err
		}
		return v.String(), nil
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{name: "pool empty", err: second(dispatch.ParsePool(""))},
		{name: "pool case", err: second(dispatch.ParsePool("Regular"))},
		{name: "pool pd", err: second(dispatch.ParsePool("pd"))},
		{name: "state", err: second(dispatch.ParseState("gone"))},
		{name: "mode", err: second(dispatch.ParseMode("weighted"))},
		{name: "mode empty", err: second(dispatch.ParseMode(""))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !errors.Is(tt.err, dispatch.ErrInvalid) {
				t.Errorf("error = %v, want ErrInvalid", tt.err)
			}
		})
	}
}

func second[T any](_ T, err error) error { return err }

func TestStrings(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{name: "zero mode is capacity", got: dispatch.Mode(0).String(), want: "capacity"},
		{name: "zero pool is regular", got: dispatch.Pool(0).String(), want: "regular"},
		{name: "route regular", got: dispatch.RouteRegular.String(), want: "regular"},
		{name: "route pd", got: dispatch.RoutePD.String(), want: "pd"},
		{name: "unknown pool", got: dispatch.Pool(9).String(), want: "Pool(9)"},
		{name: "unknown state", got: dispatch.State(9).String(), want: "State(9)"},
		{name: "unknown route", got: dispatch.Route(9).String(), want: "Route(9)"},
		{name: "unknown mode", got: dispatch.Mode(9).String(), want: "Mode(9)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestJSON(t *testing.T) {
	type view struct {
		Pool  dispatch.Pool
		State dispatch.State
		Mode  dispatch.Mode
		Route dispatch.Route
	}
	in := view{dispatch.PoolDecode, dispatch.StateDraining, dispatch.ModePaired, dispatch.RoutePD}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"Pool":"decode","State":"draining","Mode":"paired","Route":"pd"}`; string(b) != want {
		t.Errorf("Marshal = %s, want %s", b, want)
	}
	var out struct {
		Pool  dispatch.Pool
		State dispatch.State
		Mode  dispatch.Mode
	}
	if err := json.Unmarshal(b, &out); err != nil || out.Pool != in.Pool || out.State != in.State || out.Mode != in.Mode {
		t.Errorf("Unmarshal = %+v, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"Pool":"pd"}`), &out); !errors.Is(err, dispatch.ErrInvalid) {
		t.Errorf("Unmarshal of a bad pool: error = %v, want ErrInvalid", err)
	}
	if _, err := json.Marshal(view{Pool: 7}); !errors.Is(err, dispatch.ErrInvalid) {
		t.Errorf("Marshal of a bad pool: error = %v, want ErrInvalid", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  dispatch.Config
		ok   bool
	}{
		{name: "default", cfg: dispatch.DefaultConfig(), ok: true},
		{name: "zero value", cfg: dispatch.Config{}, ok: true},
		{name: "count, no slow start", cfg: dispatch.Config{Mode: dispatch.ModeCount, MissedHeartbeats: 5}, ok: true},
		{name: "floor 1", cfg: dispatch.Config{SlowStart: time.Minute, SlowStartFloor: 1}, ok: true},
		{name: "unknown mode", cfg: dispatch.Config{Mode: 5}},
		{name: "negative PD threshold", cfg: dispatch.Config{PDThreshold: -1}},
		{name: "negative timing max age", cfg: dispatch.Config{TimingMaxAge: -time.Second}},
		{name: "negative slow start", cfg: dispatch.Config{SlowStart: -time.Second}},
		{name: "negative floor", cfg: dispatch.Config{SlowStartFloor: -0.1}},
		{name: "floor above 1", cfg: dispatch.Config{SlowStartFloor: 1.5}},
		{name: "floor NaN", cfg: dispatch.Config{SlowStartFloor: math.NaN()}},
		{name: "negative missed heartbeats", cfg: dispatch.Config{MissedHeartbeats: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.ok && err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, dispatch.ErrInvalid) {
				t.Errorf("Validate() = %v, want ErrInvalid", err)
			}
		})
	}
}

// An invalid config must not stop dispatch: NewModel clamps it.
func TestNewModelClampsConfig(t *testing.T) {
	bad := dispatch.Config{Mode: 42, SlowStart: -time.Second, SlowStartFloor: math.NaN(), MissedHeartbeats: -4}
	m := dispatch.NewModel("m", pools(6, 2, 2, 8), t0, bad)
	if m.Mode() != dispatch.ModeCapacity {
		t.Errorf("Mode() = %v, want capacity", m.Mode())
	}
	if r, pd := m.Weights(); r != 48 || pd != 16 {
		t.Errorf("Weights() = %v, %v; want 48, 16", r, pd)
	}

	// A negative PD threshold counts as 0: any uncached token goes PD.
	bad = dispatch.Config{Mode: dispatch.ModeThreshold, PDThreshold: -100, TimingMaxAge: -time.Second}
	m = dispatch.NewModel("m", pools(1, 1, 1, 8), t0, bad)
	if d, err := m.Decide(dispatch.Need{PromptTokens: 1}, nil, math.MaxUint64); err != nil || d.Route != dispatch.RoutePD {
		t.Errorf("negative threshold: Decide() = %+v, %v; want PD", d, err)
	}
}
