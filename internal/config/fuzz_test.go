package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadFile feeds arbitrary file contents to Load. Errors are expected;
// a panic, or a Config that Load returns but that fails Validate, is a bug.
//
// CI runs the seed corpus; to fuzz for longer:
//
//	go test ./internal/config -run '^$' -fuzz FuzzLoadFile -fuzztime 5m -fuzzminimizetime 1x
//
// (Minimizing an interesting input derived from the ~4 KB example seed takes
// up to a minute per input at the default setting, which looks like a hang.)
func FuzzLoadFile(f *testing.F) {
	example, err := os.ReadFile(examplePath)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(example))
	for _, seed := range []string{
		"",
		"raft: 5\n",
		"raft:\n  peers: [1, null, {id: a, adress: b}, [x]]\n", //nolint:misspell // the typo is the test input
		"raft:\n  peers:\n    - {ID: a, Address: '127.0.0.1:1'}\n",
		"node_id: [a\n",
		"log:\n  level: info\n   format: json\n",
		"1: x\n? [a]\n: b\n",
		"a: &x {b: *x}\n",
		"raft.addr: x\nraft:\n  addr: y\n",
		"raft:\n  snapshot_threshold: 18446744073709551615\n  trailing_logs: -1\n  max_append_entries: 9223372036854775808\n",
		"forward:\n  timeout: 1e3\nevents:\n  retention: -5m\n",
		"policies:\n  extra_kinds: [A, null, {}]\n",
		"\xff\xfe",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, content string) {
		path := filepath.Join(t.TempDir(), "fuzz.yaml")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path, nil, nil)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Errorf("Load returned a Config without error, but Validate says: %v", err)
		}
	})
}
