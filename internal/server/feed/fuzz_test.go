package feed

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/server/apierror"
	"github.com/policyd/policyd/internal/utf8field"
)

// Run longer with:
//
//	go test ./internal/server/feed/ -run '^$' -fuzz '^FuzzClientFrame$' -fuzztime 60s
//	go test ./internal/server/feed/ -run '^$' -fuzz '^FuzzHandshake$' -fuzztime 60s

// FuzzClientFrame feeds arbitrary frames to classifyFrame, the decoder of
// everything a client sends: it never panics, accepts exactly a pong, a
// well-formed shadow_report or an invited decision_log whose text is valid
// UTF-8 (handing back what encoding/json reads), and any other frame gets the documented
// close code (1003 for binary, 4400 otherwise) with a reason that fits a
// close frame.
func FuzzClientFrame(f *testing.F) {
	for _, text := range []string{
		`{"type":"pong"}`,
		` {"type" : "pong", "extra": [1, {"x": null}]} `,
		`{"TYPE":"pong"}`,
		`{"type":"\u0070ong"}`,
		`{"type":"ping"}`,
		`{"type":"PONG"}`,
		`{"type":"pong","type":"ping"}`,
		`{"type":1}`,
		`{"type":1,"type":"pong"}`,
		`{"type":"pong","type":null}`,
		`{}`,
		`null`,
		`[]`,
		`"pong"`,
		`{"type":"pong"`,
		`{"type":"pong"} {}`,
		`{"type":"` + strings.Repeat("é", 200) + `"}`,
		"{\"type\":\"\xff\xfe\"}",
		"{\"type\":\"pong\",\"x\":\"\xff\"}",
		"{\"\xc3\":1,\"type\":\"pong\"}",
		`{"type":"pong","x":"\ud800"}`,
		`{"type":"pong","x":["\udc00"]}`,
		`{"type":"pong","x":"\ud83d\ude00"}`,
		"{\"type\":\"pong\"}\xff",
		"\xed\xa0\x80",
		"",
		`{"type":"shadow_report","counts":[{"policy":"acme.p","would_block":3,"would_allow":0,"evaluated":10}]}`,
		`{"type":"shadow_report","counts":[]}`,
		`{"type":"shadow_report"}`,
		`{"type":"shadow_report","counts":[{"policy":"p","would_block":-1}]}`,
		`{"type":"shadow_report","counts":[{"policy":"p","would_block":1e30}]}`,
		`{"type":"shadow_report","counts":[{"policy":"p","evaluated":18446744073709551616}]}`,
		`{"type":"shadow_report","counts":{"policy":"p"}}`,
		`{"type":"shadow_report","counts":[{"policy":1}]}`,
		`{"type":"shadow_report","counts":[null,{"POLICY":"p","Evaluated":2}]}`,
		`{"type":"shadow_report","counts":"x"}`,
		`{"type":"decision_log","records":[{"time":"2026-12-04T10:00:00Z","allowed":true}],"dropped":{"buffer_full":2}}`,
		`{"type":"decision_log","records":[]}`,
		`{"type":"decision_log","records":"x"}`,
		`{"type":"decision_log","dropped":{"sampled_out":-1}}`,
		`{"type":"Shadow_Report","counts":[]}`,
	} {
		f.Add(false, []byte(text))
	}
	f.Add(true, []byte(`{"type":"pong"}`))
	f.Add(true, []byte{0x00, 0xff})
	f.Fuzz(func(t *testing.T, binary bool, data []byte) {
		typ := websocket.MessageText
		if binary {
			typ = websocket.MessageBinary
		}
		for _, invited := range []bool{false, true} {
			checkFrame(t, typ, data, invited)
		}
	})
}

// checkFrame is FuzzClientFrame's oracle for one frame, with and without a
// decision_log invitation.
func checkFrame(t *testing.T, typ websocket.MessageType, data []byte, invited bool) {
	binary := typ == websocket.MessageBinary
	fr, code, reason, ok := classifyFrame(typ, data, invited)
	// utf8field.JSON is fuzzed against an oracle of its own.
	msgType := messageType(data)
	var wantReport feedv1.ShadowReport
	isReport := msgType == feedv1.TypeShadowReport && json.Unmarshal(data, &wantReport) == nil
	var wantBatch decisionsv1.Batch
	isBatch := invited && msgType == decisionsv1.TypeDecisionLog && json.Unmarshal(data, &wantBatch) == nil
	if want := !binary && (msgType == feedv1.TypePong || isReport || isBatch) && utf8field.JSON(data) == nil; ok != want {
		t.Fatalf("classifyFrame(%v, %q, %v) ok = %v, want %v (close %d %q)", typ, data, invited, ok, want, code, reason)
	}
	if ok {
		if code != 0 || reason != "" {
			t.Fatalf("accepted %q with close %d %q", data, code, reason)
		}
		switch {
		case isReport:
			if diff := cmp.Diff(&wantReport, fr.shadow); diff != "" {
				t.Fatalf("shadow_report %q decoded (-encoding/json +classifyFrame):\n%s", data, diff)
			}
		case isBatch:
			if diff := cmp.Diff(&wantBatch, fr.decisions); diff != "" {
				t.Fatalf("decision_log %q decoded (-encoding/json +classifyFrame):\n%s", data, diff)
			}
		case fr != (readFrame{}):
			t.Fatalf("pong %q came with %+v", data, fr)
		}
		return
	}
	wantCode := websocket.StatusCode(feedv1.CloseInvalidMessage)
	if binary {
		wantCode = websocket.StatusUnsupportedData
	}
	if code != wantCode {
		t.Fatalf("classifyFrame(%v, %q) close code %d, want %d", typ, data, code, wantCode)
	}
	if reason == "" || len(reason) > maxReasonBytes || !utf8.ValidString(reason) {
		t.Fatalf("close reason %q (%d bytes) does not fit a close frame", reason, len(reason))
	}
}

// messageType is the fuzz oracle for a message's type, written apart from
// classifyFrame after encoding/json's rules: for a JSON object, what its
// "type" members (names matched case-insensitively, later ones winning,
// null leaving the value as it was, anything but a string or null an
// error) leave; "" for anything else.
func messageType(data []byte) string {
	if !json.Valid(data) {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	typ := ""
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return ""
		}
		if name, _ := tok.(string); !strings.EqualFold(name, "type") || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, &typ); err != nil {
			return ""
		}
	}
	return typ
}

// FuzzHandshake builds handshake requests from fuzzed method, query and
// headers and runs what admit does before any lookup (parseRequest, then
// checkSubprotocol), in both auth modes: it never panics, what it accepts
// is a WebSocket upgrade with the parameters it read, and what it refuses
// is a 4xx (never the 500 of an unclassified error) answered by reject with
// the error envelope.
func FuzzHandshake(f *testing.F) {
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	// method, query, Sec-WebSocket-Protocol, Authorization, Connection,
	// Upgrade, Sec-WebSocket-Key; a "\n" in a header separates values sent
	// as separate header lines, an empty one leaves the header out.
	f.Add("GET", "", "", "Bearer abc.def.ghi", "Upgrade", "websocket", key)
	f.Add("GET", "since=42", "", "Bearer abc.def.ghi", "keep-alive, Upgrade", "WebSocket", key)
	f.Add("GET", "since=18446744073709551615&employee=alice", "", "", "upgrade", "websocket", key)
	f.Add("GET", "since=18446744073709551616", "", "Bearer x", "Upgrade", "websocket", key)
	f.Add("GET", "since=-1", "", "Bearer x", "Upgrade", "websocket", key)
	f.Add("GET", "since=%zz;employee=%", "", "", "Upgrade", "websocket", key)
	f.Add("GET", "", "policyd.feed.v1, bearer.abc.def.ghi", "", "Upgrade", "websocket", key)
	f.Add("GET", "", "BEARER.abc\npolicyd.feed.v1", "", "Upgrade", "websocket", key)
	f.Add("GET", "", "bearer.abc.def.ghi", "", "Upgrade", "websocket", key)
	f.Add("GET", "", "bearer., ,bearer", "", "Upgrade", "websocket", key)
	f.Add("GET", "", "", "Basic dXNlcjpwYXNz", "Upgrade", "websocket", key)
	f.Add("GET", "", "", "Bearer ", "Upgrade", "websocket", key)
	f.Add("GET", "", "", "", "close", "websocket", key)
	f.Add("GET", "", "", "Bearer x", "Upgrade", "h2c", key)
	f.Add("GET", "", "", "Bearer x", "Upgrade", "websocket", "")
	f.Add("GET", "", "", "Bearer x", "Upgrade", "websocket", key+"\n"+key)
	f.Add("GET", "", "", "Bearer x", "Upgrade", "websocket", "c2hvcnQ=")
	f.Add("POST", "", "", "Bearer x", "Upgrade", "websocket", key)
	f.Add("", "\x00", "\xff,\xfe", "\xff", "\xff", "\xff", "\xff")
	f.Add("GET", "employee=%FF", "", "", "Upgrade", "websocket", key)
	f.Add("GET", "since=1&x=\xc3", "", "Bearer x", "Upgrade", "websocket", key)
	f.Add("GET", "%FE=1", "", "Bearer x", "Upgrade", "websocket", key)
	hub := &Hub{logger: slog.New(slog.DiscardHandler)}
	f.Fuzz(func(t *testing.T, method, query, protocol, authorization, connection, upgrade, wsKey string) {
		r := httptest.NewRequest(http.MethodGet, feedv1.Path, nil)
		r.Method = method
		r.URL.RawQuery = query
		for name, v := range map[string]string{
			"Sec-WebSocket-Protocol": protocol,
			"Authorization":          authorization,
			"Connection":             connection,
			"Upgrade":                upgrade,
			"Sec-WebSocket-Key":      wsKey,
		} {
			if v == "" {
				continue
			}
			for line := range strings.SplitSeq(v, "\n") {
				r.Header.Add(name, line)
			}
		}
		r.Header.Set("Sec-WebSocket-Version", "13")

		for _, withToken := range []bool{false, true} {
			req, err := parseRequest(r, withToken)
			if err == nil {
				checkAdmitted(t, r, req, withToken)
				err = checkSubprotocol(r, req.viaSubprotocol)
			}
			if err == nil {
				continue
			}
			status, _, _ := statusOf(err)
			if status < 400 || status >= 500 {
				t.Fatalf("withToken %v: %v maps to status %d, want a 4xx", withToken, err, status)
			}
			w := httptest.NewRecorder()
			hub.reject(w, r, err)
			var env apierror.Envelope
			if w.Code != status || json.Unmarshal(w.Body.Bytes(), &env) != nil || env.Error.Code == "" || env.Error.Message == "" {
				t.Fatalf("withToken %v: %v answered %d %q, want %d with an error envelope", withToken, err, w.Code, w.Body, status)
			}
		}
	})
}

// checkAdmitted checks what parseRequest accepted against the request.
func checkAdmitted(t *testing.T, r *http.Request, req request, withToken bool) {
	t.Helper()
	if r.Method != http.MethodGet {
		t.Fatalf("accepted method %q", r.Method)
	}
	if err := checkUpgrade(r); err != nil {
		t.Fatalf("accepted a request checkUpgrade refuses: %v", err)
	}
	q := r.URL.Query()
	if err := utf8field.Query(q); err != nil {
		t.Fatalf("accepted query %q: %v", r.URL.RawQuery, err)
	}
	if s := q.Get(feedv1.QuerySince); s != "" {
		if v, err := strconv.ParseUint(s, 10, 64); err != nil || v != req.since {
			t.Fatalf("since=%q read as %d", s, req.since)
		}
	} else if req.since != 0 {
		t.Fatalf("no since, read as %d", req.since)
	}
	if !withToken {
		if req.token != "" || req.viaSubprotocol || req.employee != q.Get(feedv1.QueryEmployee) {
			t.Fatalf("auth.mode none read %+v", req)
		}
		return
	}
	switch {
	case req.token == "" || req.employee != "":
		t.Fatalf("auth.mode jwt read %+v", req)
	case req.viaSubprotocol && (r.Header.Get("Authorization") != "" || strings.Contains(req.token, ",")):
		t.Fatalf("token %q taken from the subprotocol of %v", req.token, r.Header)
	case !req.viaSubprotocol && r.Header.Get("Authorization") == "":
		t.Fatalf("token %q without an Authorization header", req.token)
	}
}
