package policy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// TestDocuments: positions in streams and lists, and the document a
// malformed stream breaks at.
func TestDocuments(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // Pos and JSON
		errAt    int      // the DocumentError's index, 0 for none
	}{
		{"yaml stream", "name: a\n---\nname: b\n", []string{`document 1 {"name":"a"}`, `document 2 {"name":"b"}`}, 0},
		{"stray separators", "---\nname: a\n---\n---\nname: b\n", []string{`document 1 {"name":"a"}`, `document 3 {"name":"b"}`}, 0},
		{"list", "- name: a\n- 3\n", []string{`document 1, item 1 {"name":"a"}`, `document 1, item 2 3`}, 0},
		{"json values", `{"name": "a"} {"name": "b", "n": 1.50}`, []string{`document 1 {"name":"a"}`, `document 2 {"n":1.50,"name":"b"}`}, 0},
		{"scalar", "hello\n", []string{`document 1 "hello"`}, 0},
		{"nothing", "", nil, 0},
		{"only comments", "# nothing here\n---\n", nil, 0},
		{"malformed yaml", "name: a\n---\nname: [x\n", nil, 2},
		{"malformed json", `{"name": "a"} {"name":`, nil, 2},
		{"non-string key", "name: a\n---\n1: x\n", nil, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := Documents([]byte(tc.in))
			if tc.errAt > 0 {
				var de *DocumentError
				if !errors.As(err, &de) || de.Index != tc.errAt {
					t.Fatalf("error %v, want a DocumentError at document %d", err, tc.errAt)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range docs {
				got = append(got, d.Pos()+" "+string(d.JSON))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("documents (-want +got):\n%s", diff)
			}
		})
	}
}

// Run longer with:
//
//	go test ./internal/policy/ -run '^$' -fuzz '^FuzzDocuments$' -fuzztime 60s

// FuzzDocuments checks that the document reader never panics, that every
// document it returns is one valid JSON value with a position inside the
// input, and that it is deterministic; a refusal names a document.
func FuzzDocuments(f *testing.F) {
	for _, s := range []string{
		"name: a\nkind: ToolPolicy\n---\nname: b\n",
		"- name: a\n- name: b\n",
		`{"name":"a"} {"name":"b"} [{"name":"c"}]`,
		"---\n---\n",
		"adopt: true\nname: x\nspec: {tool_name: Bash, action: deny}\n",
		"a: &x [1, 2]\nb: *x\n",
		"1: x\n",
		"name: [x\n",
		`{"name":`,
		"\xef\xbb\xbfname: bom\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		docs, err := Documents(raw)
		again, err2 := Documents(raw)
		if (err == nil) != (err2 == nil) || len(docs) != len(again) {
			t.Fatalf("not deterministic: %d docs, %v then %d docs, %v", len(docs), err, len(again), err2)
		}
		if err != nil {
			var de *DocumentError
			if !errors.As(err, &de) || de.Index < 1 || !strings.HasPrefix(err.Error(), "document ") {
				t.Fatalf("refusal %v names no document", err)
			}
			return
		}
		last := 0
		for i, d := range docs {
			if !json.Valid(d.JSON) || !utf8.Valid(d.JSON) {
				t.Fatalf("%s: not valid JSON: %q", d.Pos(), d.JSON)
			}
			if d.Index < last || d.Index < 1 || d.Item < 0 {
				t.Fatalf("%s after document %d: positions out of order", d.Pos(), last)
			}
			last = d.Index
			if string(d.JSON) != string(again[i].JSON) {
				t.Fatalf("%s: %s then %s", d.Pos(), d.JSON, again[i].JSON)
			}
		}
	})
}
