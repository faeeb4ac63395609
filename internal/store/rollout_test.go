package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
)

// TestCandidatePolicy: a candidate is the put's policy at revision 0,
// created and updated when the rollout was, so that its stored bytes (and
// a set's version) are the same on every node; the rollout's JSON carries
// it in that form.
func TestCandidatePolicy(t *testing.T) {
	created := time.Date(2026, 11, 27, 12, 0, 0, 123e6, time.UTC)
	p := &commandv1.Policy{Name: "acme.p", Kind: policy.KindToolPolicy, Scope: &commandv1.Scope{Org: "acme", Team: "red"},
		Labels: map[string]string{"tier": "1"}, Spec: []byte(`{"action":"deny","tool_name":"Bash"}`)}
	r := &commandv1.Rollout{Id: "r9", CreatedAtUnixMs: created.UnixMilli(),
		Changes: []*commandv1.RolloutChange{{Op: OpPut, Policy: p}, {Op: OpDelete, Name: "acme.old"}},
		Stages:  []*commandv1.RolloutStage{{Percent: 100, BakeMs: 90000}}}
	got, err := CandidatePolicy(r, p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"acme.p","kind":"ToolPolicy","scope":{"org":"acme","team":"red","employee":""},"labels":{"tier":"1"},` +
		`"spec":{"action":"deny","tool_name":"Bash"},"revision":0,"created_at":"2026-11-27T12:00:00.123Z","updated_at":"2026-11-27T12:00:00.123Z"}`
	if string(got.Stored) != want {
		t.Errorf("stored\n got %s\nwant %s", got.Stored, want)
	}
	if got.Policy.Revision != 0 || !got.Policy.CreatedAt.Equal(created) || got.Policy.Scope.Team != "red" {
		t.Errorf("policy = %+v", got.Policy)
	}
	doc, err := RolloutJSON(r)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Changes []struct {
			Op     string          `json:"op"`
			Policy json.RawMessage `json:"policy"`
			Name   string          `json:"name"`
		} `json:"changes"`
		Stages []RolloutStageDoc `json:"stages"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Changes) != 2 || string(d.Changes[0].Policy) != want || d.Changes[1].Name != "acme.old" || d.Stages[0].Bake != "1m30s" {
		t.Errorf("rollout JSON %s", doc)
	}
	for st, active := range map[string]bool{RolloutRunning: true, RolloutPaused: true, RolloutHalted: true,
		RolloutRolledBack: false, RolloutCompleted: false, RolloutAborted: false} {
		if RolloutActive(st) != active {
			t.Errorf("RolloutActive(%s) = %v", st, !active)
		}
	}
}

// TestDigestWithoutRollouts: until a rollout is stored, the digest is the
// one a release without the rollout buckets computes, so that replicas of
// both agree during a rolling upgrade; a rollout then counts.
func TestDigestWithoutRollouts(t *testing.T) {
	s := openStore(t)
	putPolicy(t, s, 2, pol("acme.a", policy.Scope{Org: "acme"}, "deny"))
	legacy := func() string {
		var out string
		err := s.view(func(tx *bolt.Tx) error {
			h := sha256.New()
			var n [8]byte
			writeLen := func(b []byte) {
				binary.BigEndian.PutUint64(n[:], uint64(len(b)))
				h.Write(n[:])
				h.Write(b)
			}
			writeLen(tx.Bucket(bucketMeta).Get(keyPrunedThrough))
			for _, name := range dataBuckets[:len(dataBuckets)-3] { // without rollouts, rollout_locks, sources
				writeLen(name)
				if err := tx.Bucket(name).ForEach(func(k, v []byte) error { writeLen(k); writeLen(v); return nil }); err != nil {
					return err
				}
			}
			out = hex.EncodeToString(h.Sum(nil))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got, want := digest(t, s), legacy(); got != want {
		t.Fatalf("digest with empty rollout buckets %s, want the earlier format's %s", got, want)
	}
	r := &commandv1.Rollout{OnHalt: OnHaltRollback, Changes: []*commandv1.RolloutChange{{Op: OpPut, Policy: &commandv1.Policy{
		Name: "acme.b", Kind: policy.KindToolPolicy, Scope: &commandv1.Scope{Org: "acme"}, Spec: []byte(`{"action":"deny","tool_name":"Bash"}`)}}},
		Stages: []*commandv1.RolloutStage{{Percent: 100, BakeMs: 1000}}}
	if err := s.ApplyBatch(3, func(b *Batch) error {
		_, _, err := b.StartRollout(Meta{Index: 3, ProcessedAt: time.Unix(3, 0)}, r)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if string(s.mustRollouts(t)) != "r3" {
		t.Fatalf("rollouts: %s", s.mustRollouts(t))
	}
	// Over the same data, the rollout buckets now count.
	if got, old := digest(t, s), legacy(); got == old {
		t.Error("a stored rollout left the digest as the earlier format computes it")
	}
}

func (s *Store) mustRollouts(t *testing.T) []byte {
	t.Helper()
	all, _, err := s.Rollouts()
	if err != nil {
		t.Fatal(err)
	}
	var ids []byte
	for _, r := range all {
		ids = append(ids, r.GetId()...)
	}
	return ids
}
