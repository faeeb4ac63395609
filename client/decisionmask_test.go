package client

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// maskedJSON masks req with m and returns the masked parts encoded, as a
// record holds them.
func maskedJSON(t testing.TB, mk *masker, req *Request) (input, http map[string]any, changed bool, enc []byte, err error) {
	t.Helper()
	input, http, changed, err = mk.mask(req)
	if err != nil {
		return nil, nil, false, nil, err
	}
	enc, err = json.Marshal(DecisionRequest{Tool: req.Tool, Input: input, HTTP: http})
	return input, http, changed, enc, err
}

func mustMasker(t testing.TB, m DecisionMask) *masker {
	t.Helper()
	mk, err := newMasker(m)
	if err != nil {
		t.Fatal(err)
	}
	return mk
}

func headers(h map[string]any) map[string]any { return map[string]any{"headers": h} }

func TestMaskRequest(t *testing.T) {
	hashOf := func(v any) string { return hashValue(v).(string) }
	tests := []struct {
		name        string
		mask        DecisionMask
		req         Request
		wantInput   map[string]any
		wantHTTP    map[string]any
		wantChanged bool
		secrets     []string // must not appear in the encoding
	}{
		{
			name:      "nothing to mask",
			req:       Request{Tool: "Bash", Input: map[string]any{"command": "ls"}, Request: headers(map[string]any{"accept": "*/*"})},
			wantInput: map[string]any{"command": "ls"},
			wantHTTP:  headers(map[string]any{"accept": "*/*"}),
		},
		{
			name: "every default header, in any case",
			req: Request{Request: map[string]any{"method": "GET", "headers": map[string]any{
				"Authorization": "Bearer s1", "COOKIE": "s2", "Set-Cookie": "s3", "proxy-Authorization": "s4",
				"X-Api-Key": "s5", "x-user": "alice",
			}}},
			wantHTTP:    map[string]any{"method": "GET", "headers": map[string]any{"x-user": "alice"}},
			wantChanged: true,
			secrets:     []string{"s1", "s2", "s3", "s4", "s5"},
		},
		{
			name:        "http.Header values",
			req:         Request{Request: map[string]any{"headers": http.Header{"Authorization": {"Bearer s1"}, "Accept": {"a", "b"}}}},
			wantHTTP:    headers(map[string]any{"Accept": []any{"a", "b"}}),
			wantChanged: true,
			secrets:     []string{"s1"},
		},
		{
			name:        "map[string]string headers",
			req:         Request{Request: map[string]any{"headers": map[string]string{"cookie": "s1", "x": "y"}}},
			wantHTTP:    headers(map[string]any{"x": "y"}),
			wantChanged: true,
			secrets:     []string{"s1"},
		},
		{
			name:        "added headers keep the defaults",
			mask:        DecisionMask{DropHeaders: []string{"X-Token"}},
			req:         Request{Request: headers(map[string]any{"x-token": "s1", "authorization": "s2", "x": "y"})},
			wantHTTP:    headers(map[string]any{"x": "y"}),
			wantChanged: true,
			secrets:     []string{"s1", "s2"},
		},
		{
			name:        "no default headers",
			mask:        DecisionMask{NoDefaultHeaders: true, DropHeaders: []string{"x-token"}},
			req:         Request{Request: headers(map[string]any{"x-token": "s1", "authorization": "kept"})},
			wantHTTP:    headers(map[string]any{"authorization": "kept"}),
			wantChanged: true,
			secrets:     []string{"s1"},
		},
		{
			name:        "headers in the tool input are not headers",
			req:         Request{Input: headers(map[string]any{"authorization": "in-input"})},
			wantInput:   headers(map[string]any{"authorization": "in-input"}),
			wantChanged: false,
		},
		{
			name:        "drop a key of the input",
			mask:        DecisionMask{DropPaths: []string{"input.password"}},
			req:         Request{Tool: "Login", Input: map[string]any{"user": "bob", "password": "s1"}},
			wantInput:   map[string]any{"user": "bob"},
			wantChanged: true,
			secrets:     []string{"s1"},
		},
		{
			name:        "drop nested",
			mask:        DecisionMask{DropPaths: []string{"input.auth.token.value"}},
			req:         Request{Input: map[string]any{"auth": map[string]any{"token": map[string]any{"value": "s1", "kind": "k"}}}},
			wantInput:   map[string]any{"auth": map[string]any{"token": map[string]any{"kind": "k"}}},
			wantChanged: true,
			secrets:     []string{"s1"},
		},
		{
			name: "drop in every element of a list",
			mask: DecisionMask{DropPaths: []string{"input.items[*].secret"}},
			req: Request{Input: map[string]any{"items": []any{
				map[string]any{"id": 1, "secret": "s1"}, map[string]any{"id": 2, "secret": "s2"}, "not a map",
			}}},
			wantInput:   map[string]any{"items": []any{map[string]any{"id": 1}, map[string]any{"id": 2}, "not a map"}},
			wantChanged: true,
			secrets:     []string{"s1", "s2"},
		},
		{
			name:        "drop a whole list",
			mask:        DecisionMask{DropPaths: []string{"input.args[*]"}},
			req:         Request{Input: map[string]any{"args": []string{"s1", "s2"}}},
			wantInput:   map[string]any{"args": []any{}},
			wantChanged: true,
			secrets:     []string{"s1", "s2"},
		},
		{
			name:        "star is every key",
			mask:        DecisionMask{DropPaths: []string{"input.env.*"}},
			req:         Request{Input: map[string]any{"env": map[string]string{"A": "s1", "B": "s2"}, "cmd": "x"}},
			wantInput:   map[string]any{"env": map[string]any{}, "cmd": "x"},
			wantChanged: true,
			secrets:     []string{"s1", "s2"},
		},
		{
			name:        "drop an HTTP attribute",
			mask:        DecisionMask{DropPaths: []string{"request.query"}},
			req:         Request{Request: map[string]any{"path": "/", "query": "token=s1"}},
			wantHTTP:    map[string]any{"path": "/"},
			wantChanged: true,
			secrets:     []string{"s1"},
		},
		{
			name:        "hash a header, case-insensitively",
			mask:        DecisionMask{HashPaths: []string{"request.headers.x-token"}},
			req:         Request{Request: headers(map[string]any{"X-Token": "s1-secret"})},
			wantHTTP:    headers(map[string]any{"X-Token": hashOf("s1-secret")}),
			wantChanged: true,
			secrets:     []string{"s1-secret"},
		},
		{
			name:        "hash list elements and a map",
			mask:        DecisionMask{HashPaths: []string{"input.keys[*]", "input.creds"}},
			req:         Request{Input: map[string]any{"keys": []any{"s1", "s2"}, "creds": map[string]any{"u": "s3"}}},
			wantInput:   map[string]any{"keys": []any{hashOf("s1"), hashOf("s2")}, "creds": hashOf(map[string]any{"u": "s3"})},
			wantChanged: true,
			secrets:     []string{`"s1"`, `"s2"`, "s3"},
		},
		{
			name:        "drop wins over hash",
			mask:        DecisionMask{DropPaths: []string{"input.p"}, HashPaths: []string{"input.p"}},
			req:         Request{Input: map[string]any{"p": "s1"}},
			wantInput:   map[string]any{},
			wantChanged: true,
			secrets:     []string{"s1"},
		},
		{
			name:      "paths that name nothing",
			mask:      DecisionMask{DropPaths: []string{"input.missing", "input.cmd.deeper", "input.cmd[*]", "request.headers.x"}, HashPaths: []string{"input.nope[*].x"}},
			req:       Request{Input: map[string]any{"cmd": "ls"}},
			wantInput: map[string]any{"cmd": "ls"},
		},
		{
			name:      "keys outside headers match exactly",
			mask:      DecisionMask{DropPaths: []string{"input.Password"}},
			req:       Request{Input: map[string]any{"password": "p"}},
			wantInput: map[string]any{"password": "p"},
		},
		{
			name: "invalid UTF-8 is encoded, secrets still go",
			mask: DecisionMask{DropPaths: []string{"input.\xff"}},
			req: Request{Input: map[string]any{"\xff": "s1", "k": "\xfe\xfd"},
				Request: headers(map[string]any{"Cookie": "s2\xff"})},
			wantInput:   map[string]any{"k": "\xfe\xfd"},
			wantHTTP:    headers(map[string]any{}),
			wantChanged: true,
			secrets:     []string{"s1", "s2"},
		},
		{
			name:      "struct values go through JSON",
			req:       Request{Input: map[string]any{"d": deepInput{Cmd: "ls"}, "n": int8(3)}},
			wantInput: map[string]any{"d": map[string]any{"Cmd": "ls"}, "n": json.Number("3")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mk := mustMasker(t, tc.mask)
			input, http, changed, enc, err := maskedJSON(t, mk, &tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantInput, input); diff != "" {
				t.Errorf("input (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantHTTP, http); diff != "" {
				t.Errorf("http (-want +got):\n%s", diff)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			for _, s := range tc.secrets {
				if bytes.Contains(enc, []byte(s)) {
					t.Errorf("the encoding holds %q: %s", s, enc)
				}
			}
		})
	}
}

// TestMaskFailures: a value masking cannot copy or encode fails the
// record, without a panic.
func TestMaskFailures(t *testing.T) {
	deep := map[string]any{}
	m := deep
	for range maxMaskDepth + 5 {
		n := map[string]any{}
		m["x"] = n
		m = n
	}
	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	list := []any{nil}
	list[0] = list
	for _, tc := range []struct {
		name string
		req  Request
	}{
		{"nested too deeply", Request{Input: deep}},
		{"a cycle", Request{Input: cyclic}},
		{"a list holding itself", Request{Request: map[string]any{"l": list}}},
		{"NaN", Request{Input: map[string]any{"n": math.NaN()}}},
		{"infinity", Request{Request: map[string]any{"n": math.Inf(1)}}},
		{"a channel", Request{Input: map[string]any{"c": make(chan int)}}},
		{"a function", Request{Input: map[string]any{"f": func() {}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, _, err := mustMasker(t, DecisionMask{}).mask(&tc.req); err == nil {
				t.Error("mask succeeded, want an error")
			}
		})
	}
}

func TestMaskPathSyntax(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"input.password", true},
		{"request.headers.x-token", true},
		{"input.items[*].secret", true},
		{"input.*", true},
		{"input.a[*]", true},
		{"input", false},
		{"object.x", false},
		{"input.", false},
		{"input..x", false},
		{"input.a[0]", false},
		{"input.[*]", false},
		{"input.a[*][*]", false},
		{"", false},
	} {
		_, err := parseMaskPath(tc.path)
		if (err == nil) != tc.ok {
			t.Errorf("parseMaskPath(%q) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
	if _, err := newMasker(DecisionMask{DropHeaders: []string{" "}}); err == nil {
		t.Error("an empty header name was accepted")
	}
}

// FuzzMaskRequest: masking any JSON input and headers never panics, never
// modifies the request, and never leaves a dropped header's value or a
// dropped path's value in the encoding.
func FuzzMaskRequest(f *testing.F) {
	f.Add(`{"password":"hunter2","items":[{"secret":"x1"}]}`, "Authorization", "Bearer abcdef")
	f.Add(`{"a":{"b":[1,2,{"c":null}]}}`, "cookie", "sessionid=zzz")
	f.Add(`[1,2]`, "X-API-KEY", "k\xff\xfe")
	f.Add(`{"\xff":"\xfe"}`, "set-cookie", "")
	f.Add(`{"password":{"deep":["secret-value"]}}`, "x-token", "tok-123456")
	mk := mustMasker(f, DecisionMask{
		DropHeaders: []string{"x-token"},
		DropPaths:   []string{"input.password", "input.items[*].secret"},
		HashPaths:   []string{"input.a.b[*]", "request.headers.x-hash"},
	})
	f.Fuzz(func(t *testing.T, input, header, value string) {
		var in map[string]any
		if json.Unmarshal([]byte(input), &in) != nil {
			in = map[string]any{"raw": input}
		}
		before, _ := json.Marshal(in)
		hdrs := map[string]any{header: value, "accept": "*/*"}
		req := Request{Tool: "T", Input: in, Request: headers(hdrs)}
		_, _, _, enc, err := maskedJSON(t, mk, &req)
		if err != nil {
			return // counted as a mask failure; a record is never kept
		}
		if after, _ := json.Marshal(in); !bytes.Equal(before, after) {
			t.Fatalf("the input was modified: %s, was %s", after, before)
		}
		if _, ok := hdrs[header]; !ok {
			t.Fatal("the caller's headers were modified")
		}
		// A dropped value has no bearing on the record: the encoding is
		// the same with another value in its place.
		if mk.headers[strings.ToLower(header)] {
			other := Request{Tool: "T", Input: in, Request: headers(map[string]any{header: "other", "accept": "*/*"})}
			if _, _, _, enc2, _ := maskedJSON(t, mk, &other); !bytes.Equal(enc, enc2) {
				t.Fatalf("dropped header %q=%q shows: %s, with another value %s", header, value, enc, enc2)
			}
		}
		if _, ok := in["password"]; ok {
			in2 := maps.Clone(in)
			in2["password"] = "other"
			other := Request{Tool: "T", Input: in2, Request: headers(hdrs)}
			if _, _, _, enc2, _ := maskedJSON(t, mk, &other); !bytes.Equal(enc, enc2) {
				t.Fatalf("dropped input.password shows: %s, with another value %s", enc, enc2)
			}
		}
	})
}
