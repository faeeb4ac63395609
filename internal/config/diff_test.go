package config

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestChangedKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"nothing", func(*Config) {}, nil},
		{"scalars", func(c *Config) {
			c.Log.Level = "debug"
			c.Raft.ElectionTimeout = time.Minute
		}, []string{"log.level", "raft.election_timeout"}},
		{"nested TLS", func(c *Config) { c.GRPC.TLS.ClientCAFile = "ca.pem" }, []string{"grpc.tls.client_ca_file"}},
		{"a list is one key", func(c *Config) {
			c.Raft.Peers = []Peer{{ID: "a", Address: "127.0.0.1:7000"}}
		}, []string{"raft.peers"}},
		{"empty list equals none", func(c *Config) { c.Drift.Callbacks = []string{} }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := Default(), Default()
			tc.mutate(&b)
			if diff := cmp.Diff(tc.want, ChangedKeys(a, b)); diff != "" {
				t.Fatalf("ChangedKeys (-want +got):\n%s", diff)
			}
		})
	}
}
