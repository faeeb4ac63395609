package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/policyd/policyd/adminclient"
)

// TestProxyStatusCommand: proxy-status asks GET /v1/proxy-status and exits
// 1 on a NACK; rollout alone asks the old path, says it is deprecated, and
// prints the same view.
func TestProxyStatusCommand(t *testing.T) {
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path+"?"+r.URL.RawQuery)
		_ = json.NewEncoder(w).Encode(adminclient.ProxyStatus{Done: true, Versions: []adminclient.ProxyStatusVersion{{
			Version: "v1", Done: true,
			Nacked: []adminclient.NackRef{{ClientRef: adminclient.ClientRef{Client: "c1", Node: "n1"}, Message: "bad regex"}},
		}}})
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args       []string
		path       string
		deprecated bool
	}{
		{[]string{"proxy-status", "--wait", "2s"}, "/v1/proxy-status?wait=2s", false},
		{[]string{"rollout", "--wait", "2s"}, "/v1/rollout?wait=2s", true},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			paths = nil
			out, err := runCLI(t, append([]string{"--server", srv.URL}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), "1 NACK(s) pending") {
				t.Errorf("err = %v, want a pending NACK", err)
			}
			if len(paths) != 1 || paths[0] != tc.path {
				t.Errorf("asked %v, want %s", paths, tc.path)
			}
			if !strings.Contains(out, "NACK c1 on n1") {
				t.Errorf("output lacks the NACK:\n%s", out)
			}
			if got := strings.Contains(out, "deprecated"); got != tc.deprecated {
				t.Errorf("deprecation note shown: %v, want %v:\n%s", got, tc.deprecated, out)
			}
		})
	}
}
