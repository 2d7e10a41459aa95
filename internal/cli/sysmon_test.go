package cli

import (
	"slices"
	"testing"
)

func TestSysmonEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want []string // nil: unchanged, not added
	}{
		{"no GODEBUG", []string{"HOME=/root", "PATH=/bin"}, []string{"HOME=/root", "PATH=/bin", "GODEBUG=" + SysmonSetting}},
		{"empty GODEBUG", []string{"GODEBUG=", "X=1"}, []string{"GODEBUG=" + SysmonSetting, "X=1"}},
		{"other settings kept", []string{"GODEBUG=http2debug=1,madvdontneed=1"}, []string{"GODEBUG=http2debug=1,madvdontneed=1," + SysmonSetting}},
		{"a setting that only starts alike", []string{"GODEBUG=scheddetail=1"}, []string{"GODEBUG=scheddetail=1," + SysmonSetting}},
		{"a variable that only ends alike", []string{"XGODEBUG=schedtrace=0"}, []string{"XGODEBUG=schedtrace=0", "GODEBUG=" + SysmonSetting}},
		{"operator's opt-out", []string{"GODEBUG=schedtrace=0"}, nil},
		{"operator's own trace", []string{"GODEBUG=madvdontneed=1, schedtrace=1000"}, nil},
		{"already re-executed", []string{"A=b", "GODEBUG=" + SysmonSetting}, nil},
	} {
		in := slices.Clone(tc.env)
		got, added := SysmonEnv(in)
		if !slices.Equal(in, tc.env) {
			t.Errorf("%s: input changed to %q", tc.name, in)
		}
		if tc.want == nil {
			if added || !slices.Equal(got, tc.env) {
				t.Errorf("%s: SysmonEnv = %q, %v; want it unchanged", tc.name, got, added)
			}
			continue
		}
		if !added || !slices.Equal(got, tc.want) {
			t.Errorf("%s: SysmonEnv = %q, %v; want %q, true", tc.name, got, added, tc.want)
		}
	}
}
