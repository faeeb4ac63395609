package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	"github.com/policyd/policyd/internal/server/proxystatus"
)

// clientsBackend is a Backend that only lists sidecars; any other method
// panics, which the API answers with 500.
type clientsBackend struct {
	Backend
	clients []*clusterv1.ClientInfo
}

func (b clientsBackend) Clients(context.Context) ([]*clusterv1.ClientInfo, []string, error) {
	return b.clients, nil, nil
}

// TestProxyStatusAndItsAlias: GET /v1/proxy-status is the ACK/NACK view,
// GET /v1/rollout answers the same and logs its deprecation once, and a
// bad wait is a 400 on both.
func TestProxyStatusAndItsAlias(t *testing.T) {
	clients := []*clusterv1.ClientInfo{
		{NodeId: "n1", ClientAddress: "c1", Transport: "grpc", VersionSent: "v2", State: proxystatus.Acked},
		{NodeId: "n1", ClientAddress: "c2", Transport: "grpc", VersionSent: "v2", State: proxystatus.Pending},
	}
	var logs bytes.Buffer
	a := New(Config{}, slog.New(slog.NewTextHandler(&logs, nil)), clientsBackend{clients: clients})
	get := func(path string) (int, []byte) {
		t.Helper()
		w := httptest.NewRecorder()
		a.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code, w.Body.Bytes()
	}
	want := proxystatus.Compute(clients)
	for _, path := range []string{"/v1/proxy-status", "/v1/rollout", "/v1/rollout"} {
		code, body := get(path)
		var got proxystatus.Status
		if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil {
			t.Fatalf("GET %s: %d %s (%v)", path, code, body, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("GET %s (-want +got):\n%s", path, diff)
		}
	}
	if n := strings.Count(logs.String(), "GET /v1/rollout is deprecated"); n != 1 {
		t.Errorf("the alias logged its deprecation %d times, want once:\n%s", n, logs.String())
	}
	for _, path := range []string{"/v1/proxy-status?wait=forever", "/v1/rollout?wait=6m"} {
		if code, body := get(path); code != http.StatusBadRequest || !strings.Contains(string(body), `"code":"invalid"`) {
			t.Errorf("GET %s: %d %s, want 400 invalid", path, code, body)
		}
	}
}
