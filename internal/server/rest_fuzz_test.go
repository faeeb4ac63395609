package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/policyd/policyd/internal/poll"
	"github.com/policyd/policyd/internal/utf8field"
)

// FuzzAdminREST sends arbitrary methods, paths, bodies and If-Match headers
// to a real single-node daemon over HTTP. Whatever arrives, the API must
// answer with a non-500 status, every error must be the JSON envelope with a
// known code, a policy the input did not address must be unchanged, and a
// write whose path, query or body text is not valid UTF-8 never succeeds.
//
// Longer run: go test ./internal/server -run '^$' -fuzz '^FuzzAdminREST$' -fuzztime 5m
func FuzzAdminREST(f *testing.F) {
	cfg := testConfig(f, "fuzz1")
	cfg.Raft.Bootstrap = true
	n := startNode(f, cfg)
	base := "http://" + n.HTTPAddr()
	client := &http.Client{Timeout: 10 * time.Second}

	sentinel := toolPolicy("sentinel.keep", "acme", "must survive")
	poll.Eventually(f, "sentinel policy stored", func() error {
		return put(client, base+"/v1/policies/sentinel.keep", sentinel)
	}, poll.Within(10*time.Second))

	before := get(f, client, base+"/v1/policies/sentinel.keep")

	methods := []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPost, http.MethodPatch, "BREW"}
	f.Add(uint8(1), "policies/acme.a", toolPolicy("acme.a", "acme", "r"), "")
	f.Add(uint8(1), "policies/acme.b", []byte(`{"name":"acme.b","kind":"ToolPolicy","spec":{"tool_name":"Bash","action":"nope"}}`), "")
	f.Add(uint8(1), "policies/acme.c", []byte(`{"name":`), "7")
	f.Add(uint8(1), "policies/acme.d", []byte(`{"name":"acme.d","kind":"Unknown","spec":{}}`), "x")
	f.Add(uint8(1), "employees/e1", []byte(`{"id":"e1","org":"acme","team":"t","status":"active"}`), "0")
	f.Add(uint8(1), "employees/e2", []byte(`{"id":"e2","org":"","status":"weird"}`), "")
	f.Add(uint8(0), "policies?org=acme&team=t&employee=e1&kind=ToolPolicy", []byte(nil), "")
	f.Add(uint8(0), "events?type=policy&after=-1&limit=abc", []byte(nil), "")
	f.Add(uint8(0), "rollout?wait=zz", []byte(nil), "")
	f.Add(uint8(2), "policies/does.not.exist", []byte(nil), "3")
	f.Add(uint8(3), "cluster/join", []byte(`{"id":"","raft_addr":"nowhere"}`), "")
	f.Add(uint8(5), "policies/x", []byte(`[]`), "")
	f.Add(uint8(1), "policies/acme.u", []byte("{\"name\":\"acme.u\",\"kind\":\"ToolPolicy\",\"spec\":{\"tool_name\":\"Bash\",\"action\":\"deny\",\"reason\":\"\xff\"}}"), "")
	f.Add(uint8(1), "policies/acme.v", []byte(`{"name":"acme.v","kind":"ToolPolicy","spec":{"tool_name":"Bash","action":"deny","reason":"\ud800"}}`), "")
	f.Add(uint8(1), "policies/acme.w", []byte("{\"name\":\"acme.w\",\"kind\":\"ToolPolicy\",\"labels\":{\"\xc3\":\"x\"},\"spec\":{\"tool_name\":\"Bash\",\"action\":\"deny\"}}"), "")
	f.Add(uint8(1), "employees/e3", []byte("{\"id\":\"e3\",\"org\":\"acme\",\"team\":\"\xe2\x82\",\"status\":\"active\"}"), "")
	f.Add(uint8(1), "employees/e%FF", []byte(`{"org":"acme","status":"active"}`), "")
	f.Add(uint8(0), "policies?org=%FF", []byte(nil), "")
	f.Add(uint8(2), "policies/%C3", []byte(nil), "")

	f.Fuzz(func(t *testing.T, m uint8, path string, body []byte, ifMatch string) {
		if strings.Contains(path, "sentinel") || strings.Contains(path, "cluster") {
			return // addresses the invariant's own state or membership
		}
		req, err := http.NewRequest(methods[int(m)%len(methods)], base+"/v1/"+path, bytes.NewReader(body))
		if err != nil {
			return // not a URL an HTTP client can send
		}
		if ifMatch != "" && !strings.ContainsFunc(ifMatch, func(r rune) bool { return r < 0x20 || r >= 0x7f }) {
			req.Header.Set("If-Match", ifMatch)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", req.Method, req.URL, err)
		}
		data, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s %s: status %d: %s", req.Method, req.URL, resp.StatusCode, data)
		}
		if resp.StatusCode >= 400 {
			var env struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(data, &env); err != nil || env.Error.Message == "" {
				t.Fatalf("%s %s: status %d without an error envelope: %q", req.Method, req.URL, resp.StatusCode, data)
			}
			switch env.Error.Code {
			case "not_found", "invalid", "conflict", "unauthorized", "forbidden", "unavailable":
			default:
				t.Fatalf("%s %s: unknown error code %q", req.Method, req.URL, env.Error.Code)
			}
		}
		// utf8field.JSON is fuzzed against an oracle of its own.
		textValid := utf8.ValidString(req.URL.Path) && utf8field.Query(req.URL.Query()) == nil &&
			utf8.Valid(body) && utf8field.JSON(body) == nil
		if resp.StatusCode/100 == 2 && (req.Method == http.MethodPut || req.Method == http.MethodPost) && !textValid {
			t.Fatalf("%s %s with text that is not valid UTF-8: status %d: %s", req.Method, req.URL, resp.StatusCode, data)
		}
		if after := get(t, client, base+"/v1/policies/sentinel.keep"); !bytes.Equal(after, before) {
			t.Fatalf("%s %s changed an unrelated policy:\nbefore %s\nafter  %s", req.Method, req.URL, before, after)
		}
	})
}

func put(c *http.Client, url string, body []byte) error {
	req, err := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		return &statusError{code: resp.StatusCode, body: string(b)}
	}
	return nil
}

func get(t testing.TB, c *http.Client, url string) []byte {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, err %v: %s", url, resp.StatusCode, err, b)
	}
	return b
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return http.StatusText(e.code) + ": " + e.body }
