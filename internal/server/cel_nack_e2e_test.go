package server

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/cel"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/poll"
)

// TestSDKCELNackVisibleInRollout is the end-to-end case of a CEL NACK: a
// ValidatingPolicy that compiles on the server but not on the sidecar
// (forced by an environment mismatch: the SDK's CEL parser takes 20 code
// points at most) is NACKed; GET /v1/rollout on another node shows the NACK
// with the compile error and the version the sidecar kept, and the sidecar
// keeps enforcing that version until the policy is fixed.
func TestSDKCELNackVisibleInRollout(t *testing.T) {
	c := newCluster(t, 3, nil)
	var servers []string
	for _, n := range c.nodes {
		servers = append(servers, n.GRPCAddr())
	}
	const sidecar = "e2e-cel-nack"
	s := startSDK(t, client.Config{
		Servers:       servers,
		Scope:         client.Scope{Org: "acme"},
		ClientAddress: sidecar,
		CELEnvOptions: []cel.EnvOption{cel.ParserExpressionSizeLimit(20)},
	})
	on := connectedNode(t, c, s, (*Node).GRPCAddr)
	writer, reader := apiFor(t, c.nodes[(on+1)%3]), apiFor(t, c.nodes[(on+2)%3])
	put := func(name, expr string, rev int64) {
		t.Helper()
		if _, err := writer.client.PutPolicy(t.Context(), name, nackPolicy(name, "acme", expr, name+" says no"), rev); err != nil {
			t.Fatalf("PUT %s (%q): %v", name, expr, err)
		}
	}
	// rolloutOf returns the sidecar's entry in GET /v1/rollout: the version
	// last sent to it, and its NACK of it or nil.
	rolloutOf := func() (version string, acked bool, nack *adminclient.NackRef, err error) {
		ro, err := reader.client.ProxyStatus(t.Context(), 0)
		if err != nil {
			return "", false, nil, err
		}
		for _, v := range ro.Versions {
			if i := slices.IndexFunc(v.Nacked, func(n adminclient.NackRef) bool { return n.Client == sidecar }); i >= 0 {
				return v.Version, false, &v.Nacked[i], nil
			}
			if slices.ContainsFunc(v.Acked, func(r adminclient.ClientRef) bool { return r.Client == sidecar }) {
				return v.Version, true, nil, nil
			}
		}
		return "", false, nil, fmt.Errorf("%s is not in the rollout: %+v", sidecar, ro)
	}

	// A short expression: within the sidecar's limit, it is ACKed.
	put("acme.short", `request.m == "GET"`, 0) // 18 code points
	s.hasPolicy(t, "acme.short")
	good := s.Version()
	poll.Eventually(t, "the sidecar's ACK in GET /v1/rollout", func() error {
		v, acked, _, err := rolloutOf()
		if err == nil && (!acked || v != good) {
			err = fmt.Errorf("version %.8s acked %v, want %.8s acked", v, acked, good)
		}
		return err
	}, poll.Within(10*time.Second))

	// A longer one: the server's environment takes it (the PUT succeeds),
	// the sidecar's does not.
	put("acme.long", `request.method == "GET"`, 0) // 23 code points
	var (
		nacked string
		nack   *adminclient.NackRef
	)
	poll.Eventually(t, "the sidecar's NACK in GET /v1/rollout", func() error {
		v, _, n, err := rolloutOf()
		switch {
		case err != nil:
			return err
		case n == nil:
			return fmt.Errorf("version %.8s not NACKed", v)
		}
		nacked, nack = v, n
		return nil
	}, poll.Within(10*time.Second))

	for _, want := range []string{"policy acme.long: spec.validations[0].expression: compile", "size exceeds limit"} {
		if !strings.Contains(nack.Message, want) {
			t.Errorf("NACK message %q does not mention %q", nack.Message, want)
		}
	}
	if nacked == good || nack.LastGoodVersion != good {
		t.Errorf("NACK of %.8s keeping %.8s, want a new version NACKed and %.8s kept", nacked, nack.LastGoodVersion, good)
	}

	// The sidecar kept the previous set: its version, its policies, and
	// Evaluate with acme.short alone (acme.long would deny a request
	// without a method).
	if got := s.Version(); got != good {
		t.Errorf("SDK version %.8s, want %.8s kept", got, good)
	}
	if slices.ContainsFunc(s.Policies(), func(p client.Policy) bool { return p.Name == "acme.long" }) {
		t.Error("the SDK holds acme.long")
	}
	if got := s.Stats().Rejected; got != 1 {
		t.Errorf("SDK rejected %d sets, want 1", got)
	}
	if d := s.Evaluate(t.Context(), client.Request{Request: map[string]any{"m": "GET"}}); !d.Allowed {
		t.Errorf("Evaluate(m=GET) = %+v, want allowed by the kept set", d)
	}
	if d := s.Evaluate(t.Context(), client.Request{Request: map[string]any{"m": "PUT"}}); d.Allowed || d.Policy != "acme.short" || d.Message != "acme.short says no" {
		t.Errorf("Evaluate(m=PUT) = %+v, want acme.short's denial", d)
	}

	// Fixing the policy lets the sidecar move on: it ACKs the next version.
	put("acme.long", `request.m != "X"`, adminclient.AnyRevision)
	poll.Eventually(t, "the sidecar to take the fixed set and ACK it", func() error {
		v, acked, _, err := rolloutOf()
		switch {
		case err != nil:
			return err
		case v == good || v == nacked || !acked:
			return fmt.Errorf("version %.8s acked %v", v, acked)
		case s.Version() != v:
			return fmt.Errorf("SDK at %.8s, rollout says %.8s acked", s.Version(), v)
		}
		return nil
	}, poll.Within(10*time.Second))

	if d := s.Evaluate(t.Context(), client.Request{Request: map[string]any{"m": "X"}}); d.Allowed || d.Policy != "acme.long" {
		t.Errorf("Evaluate(m=X) = %+v, want the fixed acme.long's denial", d)
	}
}

// validatingPolicy is a ValidatingPolicy document with one validation.
func nackPolicy(name, org, expr, message string) []byte {
	b, _ := json.Marshal(map[string]any{
		"name": name, "kind": "ValidatingPolicy",
		"scope": map[string]string{"org": org},
		"spec":  map[string]any{"validations": []map[string]string{{"expression": expr, "message": message}}},
	})
	return b
}
