package store

import (
	"path/filepath"
	"testing"
)

// TestClusterIDFirstWins: the first ID applied names the cluster; a later
// one changes nothing and notifies nobody; the ID survives a reopen.
func TestClusterIDFirstWins(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openAt(t, path)
	if id, err := s.ClusterID(); err != nil || id != "" {
		t.Fatalf("new store: ClusterID = %q, %v", id, err)
	}
	sub := s.Subscribe()
	defer sub.Close()
	apply(t, s, 1, func(b *Batch) error { return b.SetClusterID(meta(1), "first") })
	apply(t, s, 2, func(b *Batch) error { return b.SetClusterID(meta(2), "second") })
	var named []string
	for _, c := range sub.Next() {
		for _, e := range c.Entities {
			if e.Type == EntityCluster {
				named = append(named, e.ID)
			}
		}
	}
	if len(named) != 1 || named[0] != "first" {
		t.Fatalf("notified %v, want [first]", named)
	}
	closeWithin(t, s)
	s = openAt(t, path)
	if id, err := s.ClusterID(); err != nil || id != "first" {
		t.Fatalf("after reopen: ClusterID = %q, %v", id, err)
	}
}
