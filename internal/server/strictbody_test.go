package server

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"
)

// TestWriteRoutesDecodeStrictly walks every write route the admin API
// registers and sends its sample body with an unknown key, a known key in
// the wrong case, and a key given twice. Each must be refused with 400 naming
// the key: a route that decodes with encoding/json's defaults would accept
// all three, and a route added later is walked too.
func TestWriteRoutesDecodeStrictly(t *testing.T) {
	n, _ := singleNode(t, nil)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	base := "http://" + n.HTTPAddr()

	walked := 0
	for _, route := range n.api.Routes() {
		method, _, _ := strings.Cut(route.Pattern, " ")
		if method != http.MethodPost && method != http.MethodPut && method != http.MethodPatch {
			continue
		}
		s, ok := authzSamples[route.Pattern]
		switch {
		case !ok:
			t.Errorf("%s: no authzSamples entry", route.Pattern)
			continue
		case s.noBody:
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s.body), &obj); err != nil || len(obj) == 0 {
			t.Errorf("%s: sample body %q is not a JSON object with a key; give it one, or mark the route noBody", route.Pattern, s.body)
			continue
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		key, val := keys[0], string(obj[keys[0]])
		rest := strings.TrimPrefix(strings.TrimSpace(s.body), "{")
		walked++
		for _, tc := range []struct{ name, body, names string }{
			{"unknown key", `{"zz_unknown_key":1,` + rest, "zz_unknown_key"},
			{"key in the wrong case", `{"` + strings.ToUpper(key) + `":` + val + `,` + rest, strings.ToUpper(key)},
			{"duplicate key", `{"` + key + `":` + val + `,` + rest, key},
		} {
			t.Run(route.Pattern+"/"+tc.name, func(t *testing.T) {
				status, _, body := authzCall(t, hc, method, base+s.path, tc.body, "")
				if status != http.StatusBadRequest {
					t.Fatalf("%s: %d %s, want 400", tc.body, status, body)
				}
				authzEnvelope(t, body, "invalid")
				if !strings.Contains(string(body), tc.names) {
					t.Errorf("the 400 does not name %q: %s", tc.names, body)
				}
			})
		}
	}
	if walked < 5 {
		t.Fatalf("walked only %d write routes with a body: the route table or the samples are not being read", walked)
	}
}
