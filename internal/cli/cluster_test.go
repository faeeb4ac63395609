package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/internal/server/adminapi"
)

// TestClusterStatusCommandVersion: `cluster status` prints the command
// version writes use and each member's, which is how an operator follows a
// rolling upgrade.
func TestClusterStatusCommandVersion(t *testing.T) {
	tests := []struct {
		name     string
		cluster  uint32
		versions [2]uint32
		want     string
	}{
		{
			name: "mixed", cluster: 1, versions: [2]uint32{2, 0},
			want: `cluster c1
node n1 (Leader), leader n1, term 3, commit 10, applied 10
digest d1
command version 1

ID  RAFT    HTTP    GRPC    SUFFRAGE  LEADER  COMMAND_VERSION
n1  r1:700  h1:800  g1:900  Voter     true    2
n2  r2:700  h2:800  g2:900  Voter     false   0
`,
		},
		{
			name: "upgraded", cluster: 2, versions: [2]uint32{2, 2},
			want: `cluster c1
node n1 (Leader), leader n1, term 3, commit 10, applied 10
digest d1
command version 2

ID  RAFT    HTTP    GRPC    SUFFRAGE  LEADER  COMMAND_VERSION
n1  r1:700  h1:800  g1:900  Voter     true    2
n2  r2:700  h2:800  g2:900  Voter     false   2
`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := adminapi.ClusterStatus{
				ClusterID: "c1", NodeID: "n1", State: "Leader", LeaderID: "n1",
				Term: 3, CommitIndex: 10, LastIndex: 10, AppliedIndex: 10, Digest: "d1",
				CommandVersion: tc.cluster,
				Members: []adminapi.MemberStatus{
					{ID: "n1", RaftAddr: "r1:700", HTTPAddr: "h1:800", GRPCAddr: "g1:900", Suffrage: "Voter", Leader: true, CommandVersion: tc.versions[0]},
					{ID: "n2", RaftAddr: "r2:700", HTTPAddr: "h2:800", GRPCAddr: "g2:900", Suffrage: "Voter", CommandVersion: tc.versions[1]},
				},
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/cluster" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(st)
			}))
			defer srv.Close()
			var stdout, stderr bytes.Buffer
			if err := Run(t.Context(), []string{"--server", srv.URL, "cluster", "status"}, &stdout, &stderr); err != nil {
				t.Fatalf("cluster status: %v\n%s", err, stderr.String())
			}
			if diff := cmp.Diff(tc.want, stdout.String()); diff != "" {
				t.Errorf("cluster status output (-want +got):\n%s", diff)
			}
		})
	}
}
