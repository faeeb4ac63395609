package raftnode

import (
	"os"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/server/raftlog"
)

func TestSanitizeHost(t *testing.T) {
	tests := []struct{ host, want string }{
		{"vm", "vm"},
		{"web-1.example.com", "web-1"},
		{"under_score", "under_score"},
		{"-leading-dash", "leading-dash"},
		{"weird!@#chars", "weirdchars"},
		{strings.Repeat("a", 80), strings.Repeat("a", 63)},
		{"", "node1"},
		{"!!!", "node1"},
		{".starts-with-dot", "node1"},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			if got := sanitizeHost(tc.host); got != tc.want {
				t.Fatalf("sanitizeHost(%q) = %q, want %q", tc.host, got, tc.want)
			}
		})
	}
}

// TestResolveNodeID: the first start persists the ID; later starts reuse it,
// with or without node_id configured, and refuse a different one.
func TestResolveNodeID(t *testing.T) {
	dir := t.TempDir()
	id, err := ResolveNodeID("alpha", raftlog.Layout{Dir: dir})
	if err != nil || id != "alpha" {
		t.Fatalf("first start = %q, %v", id, err)
	}
	if raw, err := os.ReadFile(raftlog.Layout{Dir: dir}.NodeIDPath()); err != nil || strings.TrimSpace(string(raw)) != "alpha" {
		t.Fatalf("persisted %q, %v", raw, err)
	}
	for _, configured := range []string{"", "alpha"} {
		if id, err := ResolveNodeID(configured, raftlog.Layout{Dir: dir}); err != nil || id != "alpha" {
			t.Fatalf("restart with %q = %q, %v", configured, id, err)
		}
	}
	if _, err := ResolveNodeID("beta", raftlog.Layout{Dir: dir}); err == nil || !strings.Contains(err.Error(), "alpha") {
		t.Fatalf("mismatch accepted or unclear: %v", err)
	}
}
