package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReadDocuments: positions in streams and lists, empty documents, and
// refusals of malformed input.
func TestReadDocuments(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // positions
		err      string
	}{
		{"yaml stream", "name: a\n---\nname: b\n", []string{"document 1", "document 2"}, ""},
		{"stray separators", "---\nname: a\n---\n---\nname: b\n", []string{"document 1", "document 3"}, ""},
		{"list", "- name: a\n- name: b\n", []string{"document 1, item 1", "document 1, item 2"}, ""},
		{"json values", `{"name": "a"} {"name": "b"}`, []string{"document 1", "document 2"}, ""},
		{"json list", `[{"name": "a"}, {"name": "b"}]`, []string{"document 1, item 1", "document 1, item 2"}, ""},
		{"malformed second", "name: a\n---\nname: [x\n", nil, "document 2: not valid YAML"},
		{"malformed json", `{"name": "a"} {"name":`, nil, "document 2: not valid JSON"},
		{"non-string key", "name: a\n---\n1: x\n", nil, "document 2: a mapping key is not a string"},
		{"empty", "---\n", nil, "no document"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "in")
			if err := os.WriteFile(path, []byte(tc.in), 0o600); err != nil {
				t.Fatal(err)
			}
			docs, err := readDocuments(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range docs {
				got = append(got, d.pos)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("positions (-want +got):\n%s", diff)
			}
		})
	}
}
