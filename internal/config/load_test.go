package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

// writeConfig writes content to a YAML file in a fresh temp dir.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policyd.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// parsedFlags returns serve's flag set after parsing args.
func parsedFlags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return fs
}

// wantErrContaining fails unless err's text contains every fragment.
func wantErrContaining(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want an error containing %q", fragments)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("err = %q\nwant it to contain %q", err, f)
		}
	}
}

func TestLoadDefaults(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		fs      *pflag.FlagSet
	}{
		{name: "nothing"},
		{name: "unrelated environment", environ: []string{"HOME=/root", "POLICYD_SERVER=http://x:1", "POLICYD_TOKEN=t", "PATH"}},
		{name: "empty variable is unset", environ: []string{"POLICYD_HTTP_ADDR=", "POLICYD_RAFT_BOOTSTRAP="}},
		{name: "lower-case variable is not ours", environ: []string{"policyd_http_addr=0.0.0.0:1"}},
		{name: "flags registered but not given", fs: parsedFlags(t)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load("", tc.environ, tc.fs)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(Default(), got); diff != "" {
				t.Errorf("Load() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadEmptyFile(t *testing.T) {
	for _, content := range []string{"", "# only a comment\n", "raft:\n", "---\n"} {
		got, err := Load(writeConfig(t, content), nil, nil)
		if err != nil {
			t.Fatalf("Load(%q): %v", content, err)
		}
		if diff := cmp.Diff(Default(), got); diff != "" {
			t.Errorf("Load(%q) mismatch (-want +got):\n%s", content, diff)
		}
	}
}

func TestLoadPrecedence(t *testing.T) {
	const file = `
http:
  addr: 127.0.0.1:1001
raft:
  bootstrap: false
  heartbeat_timeout: 800ms
policies:
  extra_kinds: [FileKind]
`
	tests := []struct {
		name    string
		environ []string
		args    []string
		want    func(c *Config)
	}{
		{
			name: "file over defaults",
			want: func(c *Config) {
				c.HTTP.Addr = "127.0.0.1:1001"
				c.Raft.Bootstrap = false
				c.Raft.HeartbeatTimeout = 800 * time.Millisecond
				c.Policy.ExtraKinds = []string{"FileKind"}
			},
		},
		{
			name: "environment over file",
			environ: []string{
				"POLICYD_HTTP_ADDR=127.0.0.1:2001",
				"POLICYD_RAFT_BOOTSTRAP=true",
				"POLICYD_RAFT_HEARTBEAT_TIMEOUT=900ms",
				"POLICYD_POLICIES_EXTRA_KINDS=EnvKind, OtherKind",
			},
			want: func(c *Config) {
				c.HTTP.Addr = "127.0.0.1:2001"
				c.Raft.Bootstrap = true
				c.Raft.HeartbeatTimeout = 900 * time.Millisecond
				c.Policy.ExtraKinds = []string{"EnvKind", "OtherKind"}
			},
		},
		{
			name:    "flags over environment",
			environ: []string{"POLICYD_HTTP_ADDR=127.0.0.1:2001", "POLICYD_RAFT_BOOTSTRAP=true"},
			args:    []string{"--http-addr=127.0.0.1:3001", "--bootstrap=false"},
			want: func(c *Config) {
				c.HTTP.Addr = "127.0.0.1:3001"
				c.Raft.Bootstrap = false
				c.Raft.HeartbeatTimeout = 800 * time.Millisecond
				c.Policy.ExtraKinds = []string{"FileKind"}
			},
		},
		{
			name: "flags over file",
			args: []string{"--http-addr=127.0.0.1:3001", "--bootstrap"},
			want: func(c *Config) {
				c.HTTP.Addr = "127.0.0.1:3001"
				c.Raft.Bootstrap = true
				c.Raft.HeartbeatTimeout = 800 * time.Millisecond
				c.Policy.ExtraKinds = []string{"FileKind"}
			},
		},
		{
			name:    "a later duplicate variable wins",
			environ: []string{"POLICYD_HTTP_ADDR=127.0.0.1:2001", "POLICYD_HTTP_ADDR=127.0.0.1:2002"},
			want: func(c *Config) {
				c.HTTP.Addr = "127.0.0.1:2002"
				c.Raft.Bootstrap = false
				c.Raft.HeartbeatTimeout = 800 * time.Millisecond
				c.Policy.ExtraKinds = []string{"FileKind"}
			},
		},
		{
			name:    "variables for other keys leave the file's alone",
			environ: []string{"POLICYD_LOG_FORMAT=json", "POLICYD_RAFT_MAX_APPEND_ENTRIES=64"},
			args:    []string{"--log-level=debug"},
			want: func(c *Config) {
				c.HTTP.Addr = "127.0.0.1:1001"
				c.Raft.Bootstrap = false
				c.Raft.HeartbeatTimeout = 800 * time.Millisecond
				c.Policy.ExtraKinds = []string{"FileKind"}
				c.Log = Log{Level: "debug", Format: "json"}
				c.Raft.MaxAppendEntries = 64
			},
		},
	}
	path := writeConfig(t, file)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load(path, tc.environ, parsedFlags(t, tc.args...))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			want := Default()
			tc.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Load() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadPeers(t *testing.T) {
	const file = `
node_id: node1
raft:
  peers:
    - id: node1
      address: 127.0.0.1:7001
    - ID: node2
      Address: 127.0.0.1:7002
`
	filePeers := []Peer{{ID: "node1", Address: "127.0.0.1:7001"}, {ID: "node2", Address: "127.0.0.1:7002"}}
	tests := []struct {
		name    string
		environ []string
		want    []Peer
	}{
		{name: "from file, keys case-insensitive", want: filePeers},
		{
			name:    "environment replaces the whole list",
			environ: []string{"POLICYD_RAFT_PEERS=node1=127.0.0.1:7101, node3 = 127.0.0.1:7103"},
			want:    []Peer{{ID: "node1", Address: "127.0.0.1:7101"}, {ID: "node3", Address: "127.0.0.1:7103"}},
		},
	}
	path := writeConfig(t, file)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load(path, tc.environ, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(tc.want, got.Raft.Peers); diff != "" {
				t.Errorf("peers mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadConfigFlag(t *testing.T) {
	fromFlag := writeConfig(t, "node_id: from-flag\n")
	fromArg := writeConfig(t, "node_id: from-arg\n")

	got, err := Load("", nil, parsedFlags(t, "--config", fromFlag))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got, want := got.NodeID, "from-flag"; got != want {
		t.Errorf("node_id with --config = %q, want %q", got, want)
	}

	got, err = Load(fromArg, nil, parsedFlags(t, "--config", fromFlag))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got, want := got.NodeID, "from-arg"; got != want {
		t.Errorf("node_id with path and --config = %q, want %q (path wins)", got, want)
	}
}

func TestLoadFlagsWithoutConfigFlag(t *testing.T) {
	// A caller may bind only some of serve's flags on its own set.
	fs := pflag.NewFlagSet("other", pflag.ContinueOnError)
	fs.String("node-id", "", "")
	if err := fs.Parse([]string{"--node-id=n1"}); err != nil {
		t.Fatal(err)
	}
	got, err := Load("", nil, fs)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got, want := got.NodeID, "n1"; got != want {
		t.Errorf("node_id = %q, want %q", got, want)
	}
}

func TestRegisterFlags(t *testing.T) {
	fs := parsedFlags(t)
	var names []string
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	want := []string{"bootstrap", "config", "data-dir", "grpc-addr", "http-addr", "log-level", "node-id", "raft-addr"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("flags mismatch (-want +got):\n%s", diff)
	}
	for flag, want := range map[string]string{"http-addr": "127.0.0.1:8080", "bootstrap": "true", "data-dir": "./data", "log-level": "info"} {
		if got := fs.Lookup(flag).DefValue; got != want {
			t.Errorf("--%s default = %q, want %q", flag, got, want)
		}
	}
}

func TestLoadFileErrors(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		environ []string
		want    []string
		// validation errors are about the merged result, not the file
		validation bool
	}{
		{
			name: "unknown top-level key",
			file: "nodeid: n1\n",
			want: []string{`unknown key "nodeid"`, `did you mean "node_id"?`},
		},
		{
			name: "unknown nested key",
			file: "raft:\n  bootstrapp: true\n",
			want: []string{`unknown key "raft.bootstrapp"`, `did you mean "raft.bootstrap"?`},
		},
		{
			name: "unknown key inside a peers entry",
			file: "node_id: a\nraft:\n  peers:\n    - id: a\n      address: 127.0.0.1:7001\n    - id: b\n      adress: 127.0.0.1:7002\n", //nolint:misspell // the typo is the test input
			want: []string{`unknown key "raft.peers[1].adress"`, `did you mean "raft.peers[1].address"?`},                                //nolint:misspell // the typo is the test input
		},
		{
			name: "key under the wrong section",
			file: "heartbeat_timeout: 1s\n",
			want: []string{`unknown key "heartbeat_timeout"`, `did you mean "raft.heartbeat_timeout"?`},
		},
		{
			name: "unknown section",
			file: "tls:\n  cert: x\n",
			want: []string{`unknown key "tls"`},
		},
		{
			name: "every unknown key is reported",
			file: "bogus1: 1\nlog:\n  bogus2: 2\n",
			want: []string{`unknown key "bogus1"`, `unknown key "log.bogus2"`},
		},
		{
			name: "keys differing only in case",
			file: "raft:\n  addr: 127.0.0.1:1\nRaft:\n  addr: 127.0.0.1:2\n",
			want: []string{`key "raft" repeats "Raft" (keys are case-insensitive)`},
		},
		{
			name: "section is not a mapping",
			file: "raft: 5\n",
			want: []string{`raft: 5 is not a mapping`},
		},
		{
			name: "dotted key",
			file: "raft.addr: 127.0.0.1:1\n",
			want: []string{`key "raft.addr" contains a dot`},
		},
		{
			name: "string for an integer",
			file: "raft:\n  max_append_entries: lots\n",
			want: []string{`raft.max_append_entries: "lots" is not an integer`},
		},
		{
			name: "float for an integer",
			file: "raft:\n  snapshot_retain: 1.5\n",
			want: []string{`raft.snapshot_retain: 1.5 is not an integer`},
		},
		{
			name: "negative unsigned",
			file: "raft:\n  snapshot_threshold: -1\n",
			want: []string{`raft.snapshot_threshold: -1 is negative`},
		},
		{
			name: "integer for a string",
			file: "node_id: 7\n",
			want: []string{`node_id: 7 is not a string`},
		},
		{
			name: "mapping for a string",
			file: "data_dir:\n  x: 1\n",
			want: []string{`data_dir: a mapping is not a string`},
		},
		{
			name: "bad boolean",
			file: "raft:\n  bootstrap: maybe\n",
			want: []string{`raft.bootstrap: "maybe" is not a boolean`},
		},
		{
			name: "bad duration",
			file: "raft:\n  heartbeat_timeout: 5x\n",
			want: []string{`raft.heartbeat_timeout: "5x" is not a duration`},
		},
		{
			name: "duration without a unit",
			file: "forward:\n  timeout: 1000\n",
			want: []string{`forward.timeout: 1000 is not a duration: give a unit`},
		},
		{
			name: "scalar for a list",
			file: "policies:\n  extra_kinds: Foo\n",
			want: []string{`policies.extra_kinds: "Foo" is not a list`},
		},
		{
			name: "list entry of the wrong type",
			file: "policies:\n  extra_kinds: [Foo, [Bar]]\n",
			want: []string{`policies.extra_kinds[1]: a list is not a string`},
		},
		{
			name: "peers entry is not a mapping",
			file: "node_id: a\nraft:\n  peers: [a]\n",
			want: []string{`raft.peers[0]: "a" is not a mapping`},
		},
		{
			name: "wrong type in a peers entry",
			file: "node_id: a\nraft:\n  peers:\n    - id: 1\n      address: 127.0.0.1:7001\n",
			want: []string{`raft.peers[0].id: 1 is not a string`},
		},
		{
			name: "YAML syntax error names the line",
			file: "log:\n  level: info\n   format: json\n",
			want: []string{"line 3"},
		},
		{
			name: "YAML duplicate key",
			file: "node_id: a\nnode_id: b\n",
			want: []string{`"node_id" already defined`},
		},
		{
			name: "top level is a list",
			file: "- a\n",
			want: []string{"line 1"},
		},
		{
			name:       "invalid value is reported by Validate",
			file:       "log:\n  level: verbose\n",
			want:       []string{`log.level: "verbose" must be one of debug, info, warn, error`},
			validation: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.file)
			got, err := Load(path, tc.environ, nil)
			wantErrContaining(t, err, tc.want...)
			if err != nil && !tc.validation && !strings.Contains(err.Error(), `config file "`+path+`"`) {
				t.Errorf("err = %q, want it to name the file %q", err, path)
			}
			if diff := cmp.Diff(Config{}, got); diff != "" {
				t.Errorf("Load returned a Config with its error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadEnvErrors(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    []string
	}{
		{
			name:    "bad integer",
			environ: []string{"POLICYD_RAFT_MAX_APPEND_ENTRIES=lots"},
			want:    []string{`environment variable POLICYD_RAFT_MAX_APPEND_ENTRIES: raft.max_append_entries: "lots" is not an integer`},
		},
		{
			name:    "bad duration",
			environ: []string{"POLICYD_EVENTS_RETENTION=1 day"},
			want:    []string{`environment variable POLICYD_EVENTS_RETENTION: events.retention: "1 day" is not a duration`},
		},
		{
			name:    "bad boolean",
			environ: []string{"POLICYD_AUTH_ALLOW_OPEN_ADMIN=yes please"},
			want:    []string{`auth.allow_open_admin: "yes please" is not a boolean`},
		},
		{
			name:    "peers entry without =",
			environ: []string{"POLICYD_NODE_ID=a", "POLICYD_RAFT_PEERS=a=127.0.0.1:7001,b"},
			want:    []string{`POLICYD_RAFT_PEERS: raft.peers: entry "b" is not id=address`},
		},
		{
			name:    "every bad variable is reported",
			environ: []string{"POLICYD_RAFT_MAX_APPEND_ENTRIES=x", "POLICYD_RAFT_SNAPSHOT_RETAIN=y"},
			want:    []string{"POLICYD_RAFT_MAX_APPEND_ENTRIES", "POLICYD_RAFT_SNAPSHOT_RETAIN"},
		},
		{
			name:    "invalid value",
			environ: []string{"POLICYD_RAFT_HEARTBEAT_TIMEOUT=0s"},
			want:    []string{"raft.heartbeat_timeout: must be > 0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("", tc.environ, nil)
			wantErrContaining(t, err, tc.want...)
		})
	}
}

func TestLoadFlagErrors(t *testing.T) {
	_, err := Load("", nil, parsedFlags(t, "--http-addr=localhost"))
	wantErrContaining(t, err, `http.addr: "localhost" is not host:port`)
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	for _, tc := range []struct {
		name string
		load func() error
	}{
		{"path", func() error { _, err := Load(path, nil, nil); return err }},
		{"--config", func() error { _, err := Load("", nil, parsedFlags(t, "--config="+path)); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.load()
			wantErrContaining(t, err, path)
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("err = %v, want it to wrap fs.ErrNotExist", err)
			}
		})
	}
}

func TestKnownKeys(t *testing.T) {
	keys := knownKeys()
	for _, want := range []string{"node_id", "raft.heartbeat_timeout", "raft.peers", "policies.extra_kinds", "forward.timeout"} {
		if !slices.Contains(keys, want) {
			t.Errorf("knownKeys() lacks %q: %q", want, keys)
		}
	}
	for _, notLeaf := range []string{"raft", "raft.peers.id"} {
		if slices.Contains(keys, notLeaf) {
			t.Errorf("knownKeys() has %q, which holds no value of its own", notLeaf)
		}
	}
	seen := map[string]string{}
	for _, k := range keys {
		if other, dup := seen[envName(k)]; dup {
			t.Errorf("keys %q and %q share the variable %s", other, k, envName(k))
		}
		seen[envName(k)] = k
	}
	for _, f := range flagKeys {
		if !slices.Contains(keys, f.key) {
			t.Errorf("flag --%s sets unknown key %q", f.flag, f.key)
		}
	}
}
