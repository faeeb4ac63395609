package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/store"
)

// singleNode starts a bootstrapped one-node cluster and waits until it leads.
func singleNode(t *testing.T, mutate func(*config.Config)) (*Node, *api) {
	t.Helper()
	cfg := testConfig(t, "solo")
	cfg.Raft.Bootstrap = true
	if mutate != nil {
		mutate(&cfg)
	}
	n := startNode(t, cfg)
	waitLeads(t, n)
	return n, apiFor(t, n)
}

// waitLeads waits until a one-node cluster's node leads and has registered
// its addresses.
func waitLeads(t *testing.T, n *Node) {
	t.Helper()
	poll.Eventually(t, n.ID()+" to lead and register", func() error {
		if !n.IsLeader() {
			return errors.New("not leader yet")
		}
		_, err := n.store.Member(n.ID())
		return err
	}, poll.Within(10*time.Second))

}

// TestBadInputIsRejectedAndStoresNothing walks the malformed requests: each
// gets the right status with the error envelope naming the problem, and the
// state is unchanged afterwards.
func TestBadInputIsRejectedAndStoresNothing(t *testing.T) {
	n, a := singleNode(t, nil)
	digest, _, err := n.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	big := `{"name":"big","kind":"ToolPolicy","spec":{"tool_name":"Bash","action":"deny","reason":"` + strings.Repeat("x", 1<<20) + `"}}`
	tests := []struct {
		name, method, path, body string
		status                   int
		code, mention            string
	}{
		{"malformed JSON", "PUT", "/v1/policies/p", `{"name":`, 400, "invalid", "JSON"},
		{"not an object", "PUT", "/v1/policies/p", `[1,2]`, 400, "invalid", ""},
		{"empty body", "PUT", "/v1/policies/p", ``, 400, "invalid", "body"},
		{"wrong type", "PUT", "/v1/policies/p", `{"kind":"ToolPolicy","scope":{"org":5},"spec":{}}`, 400, "invalid", "scope.org"},
		{"unknown field", "PUT", "/v1/policies/p", `{"kind":"ToolPolicy","title":"p","spec":{}}`, 400, "invalid", "title"},
		{"unknown spec field", "PUT", "/v1/policies/p", `{"kind":"ToolPolicy","spec":{"tool_name":"B","action":"deny","extra":1}}`, 400, "invalid", "spec.extra"},
		{"invalid name in path", "PUT", "/v1/policies/Bad_Name", `{"kind":"ToolPolicy","spec":{"tool_name":"B","action":"deny"}}`, 400, "invalid", "name"},
		{"name mismatch", "PUT", "/v1/policies/p", `{"name":"q","kind":"ToolPolicy","spec":{"tool_name":"B","action":"deny"}}`, 400, "invalid", "name"},
		{"unknown kind", "PUT", "/v1/policies/p", `{"kind":"Nope","spec":{}}`, 400, "invalid", "kind"},
		{"bad action", "PUT", "/v1/policies/p", `{"kind":"ToolPolicy","spec":{"tool_name":"B","action":"maybe"}}`, 400, "invalid", "spec.action"},
		{"bad regexp", "PUT", "/v1/policies/p", `{"kind":"ToolPolicy","spec":{"tool_name":"B","action":"deny","conditions":{"patterns":["ok","(unclosed"]}}}`, 400, "invalid", "spec.conditions.patterns[1]"},
		{"bad CEL", "PUT", "/v1/policies/p", `{"kind":"ValidatingPolicy","spec":{"validations":[{"expression":"object.x ==","message":"m"}]}}`, 400, "invalid", "spec.validations[0].expression"},
		{"team without org", "PUT", "/v1/policies/p", `{"kind":"ToolPolicy","scope":{"team":"t"},"spec":{"tool_name":"B","action":"deny"}}`, 400, "invalid", "scope"},
		{"body over 1 MiB", "PUT", "/v1/policies/big", big, 413, "invalid", "exceeds"},
		{"employee bad status", "PUT", "/v1/employees/alice", `{"org":"acme","status":"sleeping"}`, 400, "invalid", "status"},
		{"employee without org", "PUT", "/v1/employees/alice", `{"status":"active"}`, 400, "invalid", "org"},
		{"employee id mismatch", "PUT", "/v1/employees/alice", `{"id":"bob","org":"acme"}`, 400, "invalid", "id"},
		{"unknown path", "GET", "/v2/nothing", ``, 404, "not_found", "/v2/nothing"},
		{"wrong method", "POST", "/v1/policies/p", `{}`, 405, "invalid", "POST"},
		{"missing policy", "GET", "/v1/policies/nope", ``, 404, "not_found", "nope"},
		{"delete missing", "DELETE", "/v1/policies/nope", ``, 404, "not_found", "nope"},
		{"missing employee", "GET", "/v1/employees/nobody", ``, 404, "not_found", "nobody"},
		{"filter team without org", "GET", "/v1/policies?team=t", ``, 400, "invalid", "org"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.body != "" || tc.method == "PUT" {
				body = []byte(tc.body)
			}
			r := a.do(tc.method, tc.path, body, nil)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if code := r.errCode(t); code != tc.code {
				t.Errorf("code %q, want %q", code, tc.code)
			}
			if !strings.Contains(string(r.body), tc.mention) {
				t.Errorf("message %s does not mention %q", r.body, tc.mention)
			}
		})
	}
	after, _, err := n.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if after != digest {
		t.Fatal("state changed after rejected requests")
	}
}

// TestExtraKinds: a kind outside the built-ins is accepted only when listed.
func TestExtraKinds(t *testing.T) {
	_, a := singleNode(t, func(c *config.Config) { c.Policy.ExtraKinds = []string{"RateLimit"} })
	ok := a.do("PUT", "/v1/policies/rl", []byte(`{"kind":"RateLimit","spec":{"rps":10}}`), nil)
	if ok.status != http.StatusOK {
		t.Fatalf("listed extra kind: %d %s", ok.status, ok.body)
	}
	notObject := a.do("PUT", "/v1/policies/rl", []byte(`{"kind":"RateLimit","spec":[1]}`), nil)
	if notObject.status != http.StatusBadRequest {
		t.Fatalf("extra kind with non-object spec: %d %s", notObject.status, notObject.body)
	}
}

// TestAdminTokenRoles: with a tokens file, reads need a read or admin token,
// writes an admin token; probes stay open.
func TestAdminTokenRoles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("# role token name\nread reader-token-0123456789 ci\nadmin admin-token-0123456789 ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, a := singleNode(t, func(c *config.Config) { c.Auth.AdminTokensFile = path })
	const (
		none   = ""
		bad    = "Bearer wrong-token-0123456789"
		reader = "Bearer reader-token-0123456789"
		admin  = "Bearer admin-token-0123456789"
	)
	tests := []struct {
		method, path, auth string
		body               []byte
		want               int
	}{
		{"GET", "/healthz", none, nil, 200},
		{"GET", "/readyz", none, nil, 200},
		{"GET", "/v1/policies", none, nil, 401},
		{"GET", "/v1/policies", bad, nil, 401},
		{"GET", "/v1/policies", "Basic cmVhZGVyOng=", nil, 401},
		{"GET", "/v1/policies", reader, nil, 200},
		{"GET", "/v1/cluster", reader, nil, 200},
		{"GET", "/metrics", none, nil, 401},
		{"GET", "/metrics", reader, nil, 200},
		{"PUT", "/v1/policies/p", reader, toolPolicy("p", "acme", "x"), 403},
		{"PUT", "/v1/policies/p", admin, toolPolicy("p", "acme", "x"), 200},
		{"DELETE", "/v1/policies/p", reader, nil, 403},
		{"POST", "/v1/cluster/join", reader, []byte(`{"id":"x","raft_addr":"127.0.0.1:1"}`), 403},
		{"DELETE", "/v1/policies/p", admin, nil, 200},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path+" "+tc.auth, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			r := a.do(tc.method, tc.path, tc.body, hdr)
			if r.status != tc.want {
				t.Fatalf("status %d, want %d: %s", r.status, tc.want, r.body)
			}
			if tc.want >= 400 {
				r.errCode(t)
			}
		})
	}
	m := a.do("GET", "/metrics", nil, map[string]string{"Authorization": reader})
	for _, name := range []string{"policyd_http_requests_total", "policyd_raft_is_leader 1", "policyd_store_applied_index"} {
		if !bytes.Contains(m.body, []byte(name)) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestRefusesCorruptOrForeignStateDB: the node will not start on a state.db it
// cannot trust, names the file, and leaves it byte-for-byte alone.
func TestRefusesCorruptOrForeignStateDB(t *testing.T) {
	garbage := bytes.Repeat([]byte("not a database "), 1000)
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string)
		mention string
	}{
		{"garbage", func(t *testing.T, path string) {
			if err := os.WriteFile(path, garbage, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "state.db"},
		{"foreign bbolt", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("etcd")); return err }); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
		}, "not a policyd state database"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "n")
			cfg.Raft.Bootstrap = true
			if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(cfg.DataDir, "state.db")
			tc.prepare(t, path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			n, err := New(cfg, testLogger(t), nil)
			if err == nil {
				closeNode(t, n)
				t.Fatal("node started on a bad state.db")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not name %s and %q", err, path, tc.mention)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Fatal("state.db was modified")
			}
		})
	}
}

// TestRestartKeepsStateAndIdentity: a single node restarted on its data
// directory keeps every policy and leads again; a different node_id on the
// same directory is refused.
func TestRestartKeepsStateAndIdentity(t *testing.T) {
	cfg := testConfig(t, "solo")
	cfg.Raft.Bootstrap = true
	n := startNode(t, cfg)
	waitLeads(t, n)
	a := apiFor(t, n)
	p := a.putPolicy("keep-me", "acme", "x")
	cfg.Raft.Addr = n.RaftAddr()
	closeNode(t, n)

	other := cfg
	other.NodeID = "someone-else"
	if m, err := New(other, testLogger(t), nil); err == nil {
		closeNode(t, m)
		t.Fatal("started with a node_id that does not match the data directory")
	} else if !strings.Contains(err.Error(), "solo") {
		t.Fatalf("error %q does not name the recorded id", err)
	}

	n2 := startNode(t, cfg)
	got, err := n2.store.GetPolicy("keep-me")
	if err != nil || got.Revision != p.Revision {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
	waitLeads(t, n2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n2.ConsistentRead(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n2.store.GetPolicy("nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("want ErrNotFound, got %v", err)
	}
}

// TestLostStateDBIsRebuilt: a node whose state.db is gone but whose Raft
// directory survived rebuilds its state from the latest snapshot plus the
// log after it, instead of silently missing everything up to the snapshot.
func TestLostStateDBIsRebuilt(t *testing.T) {
	cfg := testConfig(t, "solo")
	cfg.Raft.Bootstrap = true
	n := startNode(t, cfg)
	waitLeads(t, n)
	a := apiFor(t, n)
	a.putPolicy("before-snapshot", "acme", "x")
	if err := n.consensus.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	a.putPolicy("after-snapshot", "acme", "x")
	want, _, err := n.store.Digest()
	if err != nil {
		t.Fatal(err)
	}
	// Same addresses, so the restart re-registers nothing and the digest
	// must match exactly.
	cfg.Raft.Addr, cfg.HTTP.Addr, cfg.GRPC.Addr = n.RaftAddr(), n.HTTPAddr(), n.GRPCAddr()
	closeNode(t, n)
	if err := os.Remove(filepath.Join(cfg.DataDir, "state.db")); err != nil {
		t.Fatal(err)
	}

	n2 := startNode(t, cfg)
	poll.Eventually(t, "state rebuilt", func() error {
		for _, name := range []string{"before-snapshot", "after-snapshot"} {
			if _, err := n2.store.GetPolicy(name); err != nil {
				return err
			}
		}
		got, _, err := n2.store.Digest()
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("digest %.8s, want %.8s", got, want)
		}
		return nil
	}, poll.Within(10*time.Second))

}
