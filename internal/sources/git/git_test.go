package git

import (
	"strings"
	"testing"
	"time"
)

// TestNew: what a configuration must hold, and its defaults.
func TestNew(t *testing.T) {
	const https = "https://git.example.com/platform/policies.git"
	tests := []struct {
		name string
		cfg  Config
		want string // "" for accepted
	}{
		{"minimal", Config{Name: "policies", URL: https, Ref: "main"}, ""},
		{"token", Config{Name: "policies", URL: https, Ref: "main", TokenFile: "/run/token"}, ""},
		{"ssh", Config{Name: "p", URL: "git@git.example.com:platform/policies.git", Ref: "main", SSHKeyFile: "/k", KnownHostsFile: "/kh"}, ""},
		{"ssh url", Config{Name: "p", URL: "ssh://git@git.example.com/policies.git", Ref: "v1", SSHKeyFile: "/k", KnownHostsFile: "/kh"}, ""},
		{"git daemon", Config{Name: "p", URL: "git://127.0.0.1/policies.git", Ref: "main"}, ""},
		{"no name", Config{URL: https, Ref: "main"}, "name must be"},
		{"name with a slash", Config{Name: "../x", URL: https, Ref: "main"}, "name must be"},
		{"name in capitals", Config{Name: "Policies", URL: https, Ref: "main"}, "name must be"},
		{"no url", Config{Name: "p", Ref: "main"}, "url is required"},
		{"no ref", Config{Name: "p", URL: https}, "ref is required"},
		{"negative interval", Config{Name: "p", URL: https, Ref: "main", Interval: -time.Second}, "negative"},
		{"path above the root", Config{Name: "p", URL: https, Ref: "main", Path: "../x"}, "leaves the repository"},
		{"ssh key without known hosts", Config{Name: "p", URL: "ssh://git@h/p.git", Ref: "main", SSHKeyFile: "/k"}, "needs auth.known_hosts_file"},
		{"known hosts without a key", Config{Name: "p", URL: "ssh://git@h/p.git", Ref: "main", KnownHostsFile: "/kh"}, "without auth.ssh_key_file"},
		{"ssh without a key", Config{Name: "p", URL: "git@h:p.git", Ref: "main"}, "needs auth.ssh_key_file and auth.known_hosts_file"},
		{"token and key", Config{Name: "p", URL: https, Ref: "main", TokenFile: "/t", SSHKeyFile: "/k", KnownHostsFile: "/kh"}, "choose one"},
		{"token over ssh", Config{Name: "p", URL: "ssh://git@h/p.git", Ref: "main", TokenFile: "/t"}, "not an http(s) remote"},
		{"key over https", Config{Name: "p", URL: https, Ref: "main", SSHKeyFile: "/k", KnownHostsFile: "/kh"}, "not an ssh remote"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.cfg, t.TempDir(), nil)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := d.Name(), "git:"+tc.cfg.Name; got != want {
				t.Errorf("Name() = %q, want %q", got, want)
			}
		})
	}
}

// TestNewDefaults: the interval defaults, and path is a tree path.
func TestNewDefaults(t *testing.T) {
	tests := []struct{ path, want string }{
		{"", ""}, {"/", ""}, {".", ""}, {"policies/", "policies"}, {"/policies", "policies"}, {"a/./b/../c/", "a/c"},
	}
	for _, tc := range tests {
		d, err := New(Config{Name: "p", URL: "https://h/p.git", Ref: "main", Path: tc.path}, t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.cfg.Path != tc.want {
			t.Errorf("path %q became %q, want %q", tc.path, d.cfg.Path, tc.want)
		}
		if d.cfg.Interval != DefaultInterval {
			t.Errorf("interval %v, want %v", d.cfg.Interval, DefaultInterval)
		}
	}
}

// TestRedact: a password in a URL never reaches a message.
func TestRedact(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://git.example.com/p.git", "https://git.example.com/p.git"},
		{"https://user:hunter2@git.example.com/p.git", "https://user:xxxxx@git.example.com/p.git"},
		{"git@git.example.com:p.git", "git@git.example.com:p.git"},
	}
	for _, tc := range tests {
		if got := redact(tc.in); got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
