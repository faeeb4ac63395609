package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNodeEnvFlag(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		wantErr bool
	}{
		{name: "policyd key", value: "POLICYD_RAFT_COMMIT_TIMEOUT=5ms"},
		{name: "empty value", value: "POLICYD_LOG_LEVEL="},
		{name: "runtime GOGC", value: "GOGC=200"},
		{name: "runtime GOMEMLIMIT", value: "GOMEMLIMIT=1GiB"},
		{name: "runtime GODEBUG", value: "GODEBUG=gctrace=1"},
		{name: "prefix alone", value: "POLICYD_=x", wantErr: true},
		{name: "no equals sign", value: "GOGC", wantErr: true},
		{name: "other variable", value: "PATH=/tmp", wantErr: true},
		{name: "etcd variable", value: "ETCD_QUOTA_BACKEND_BYTES=1", wantErr: true},
		{name: "runtime name as prefix", value: "GOGCX=1", wantErr: true},
		{name: "lower case", value: "gogc=200", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e envList
			err := e.Set(tt.value)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Set(%q) error = %v, want error %v", tt.value, err, tt.wantErr)
			}
			var want envList
			if !tt.wantErr {
				want = envList{tt.value}
			}
			if diff := cmp.Diff(want, e); diff != "" {
				t.Errorf("after Set(%q) (-want +got):\n%s", tt.value, diff)
			}
		})
	}
}
