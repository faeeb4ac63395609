package store

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/policy"
)

// heads reads every policy head.
func heads(t *testing.T, s *Store) map[string]*policy.Policy {
	t.Helper()
	out := map[string]*policy.Policy{}
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPolicyHeads).ForEach(func(k, _ []byte) error {
			h, err := getHead(tx, string(k))
			out[string(k)] = h
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// headsOf is what the heads must be: the stored policies' head fields.
func headsOf(t *testing.T, s *Store) map[string]*policy.Policy {
	t.Helper()
	ps, err := s.ListPolicies(PolicyFilter{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*policy.Policy{}
	for _, p := range ps {
		out[p.Name] = &policy.Policy{Name: p.Name, Kind: p.Kind, Scope: p.Scope, Revision: p.Revision, CreatedAt: p.CreatedAt}
	}
	return out
}

// TestPolicyHeads: the heads follow puts, moves and deletes, serve
// compare-and-set and StoredPolicy, stay out of the digest, and a file
// whose heads lag its applied index (a release before them wrote it) has
// them rebuilt on open.
func TestPolicyHeads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openAt(t, path)
	putPolicy(t, s, 1, pol("a", policy.Scope{Org: "acme"}, "deny"))
	putPolicy(t, s, 2, pol("b", policy.Scope{}, "audit"))
	putPolicy(t, s, 3, pol("a", policy.Scope{Org: "other"}, "deny")) // moved
	apply(t, s, 4, func(b *Batch) error { return b.DeletePolicy(meta(4), "b", nil) })
	if diff := cmp.Diff(headsOf(t, s), heads(t, s)); diff != "" {
		t.Fatalf("heads after writes (-want +got):\n%s", diff)
	}
	a, err := s.GetPolicy("a")
	if err != nil {
		t.Fatal(err)
	}
	raw, revision, err := s.StoredPolicy("a")
	if err != nil || revision != 3 || string(raw) != string(canonical(t, a)) {
		t.Fatalf("StoredPolicy(a) = %s, %d, %v", raw, revision, err)
	}
	if _, _, err := s.StoredPolicy("b"); err == nil {
		t.Fatal("StoredPolicy of a deleted policy succeeded")
	}
	// Compare-and-set reads the head's revision.
	apply(t, s, 5, func(b *Batch) error {
		if _, _, err := b.PutPolicy(meta(5), pol("a", policy.Scope{Org: "other"}, "audit"), rev(2)); err == nil {
			t.Error("put at a stale revision succeeded")
		}
		return nil
	})
	before := digest(t, s)

	// A release before heads wrote this file: no heads bucket, no index.
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketPolicyHeads); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Delete(keyHeadsIndex)
	}); err != nil {
		t.Fatal(err)
	}
	closeWithin(t, s)
	s = openAt(t, path)
	if diff := cmp.Diff(headsOf(t, s), heads(t, s)); diff != "" {
		t.Fatalf("heads after reopening a file without them (-want +got):\n%s", diff)
	}
	if got := digest(t, s); got != before {
		t.Errorf("digest %s after rebuilding heads, %s before: heads must stay out of it", got, before)
	}
}
