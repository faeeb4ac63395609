package git

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/internal/sources"
)

const testToken = "s3cret-token-value"

func toolPolicy(name, reason string) string {
	return fmt.Sprintf("name: %s\nkind: ToolPolicy\nscope: {org: acme}\nspec:\n  tool_name: Bash\n  action: deny\n  reason: %s\n", name, reason)
}

// declared summarises an observation's policies as "object name reason".
func declared(t *testing.T, obs *sources.Observation) []string {
	t.Helper()
	var out []string
	for _, d := range obs.Policies {
		var spec struct {
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(d.Policy.Spec, &spec); err != nil {
			t.Fatalf("%s: spec: %v", d.Object, err)
		}
		s := d.Object + " " + d.Policy.Name + " " + spec.Reason
		if d.Adopt {
			s += " adopt"
		}
		out = append(out, s)
	}
	return out
}

func observe(t *testing.T, d *Driver) *sources.Observation {
	t.Helper()
	obs, err := d.Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !obs.Complete || !obs.Atomic {
		t.Fatalf("observation complete=%v atomic=%v, want both", obs.Complete, obs.Atomic)
	}
	return obs
}

// TestObserveCreateChangeDelete: documents appear, change and disappear
// with the commits, and the revision follows the ref.
func TestObserveCreateChangeDelete(t *testing.T) {
	s := newServer(t, testToken)
	r := s.Repo(t, "policies")
	r.Write("policies/a.yaml", toolPolicy("acme.a1", "one")+"---\n"+toolPolicy("acme.a2", "two"))
	r.Write("policies/team/b.json", `{"name":"acme.b","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"tool_name":"Write","action":"audit","reason":"bee"}}`)
	r.Write("policies/list.yml", "- "+strings.ReplaceAll(toolPolicy("acme.l1", "first"), "\n", "\n  ")+"\n- "+strings.ReplaceAll(toolPolicy("acme.l2", "second"), "\n", "\n  "))
	r.Write("policies/README.md", "not a policy")
	r.Write("policies/.github/workflows/ci.yml", "on: push\n")
	r.Write("other/x.yaml", "not: read\n")
	c1 := r.Commit("first")
	d, _ := newDriver(t, s, Config{URL: r.URL, Path: "policies/"})

	steps := []struct {
		name   string
		change func() string
		want   []string
	}{
		{"create", func() string { return c1 }, []string{
			"policies/a.yaml#1 acme.a1 one",
			"policies/a.yaml#2 acme.a2 two",
			"policies/list.yml#1.1 acme.l1 first",
			"policies/list.yml#1.2 acme.l2 second",
			"policies/team/b.json#1 acme.b bee",
		}},
		{"change and delete a file", func() string {
			r.Write("policies/a.yaml", toolPolicy("acme.a1", "one")+"---\n"+toolPolicy("acme.a2", "changed"))
			r.Remove("policies/team/b.json")
			r.Remove("policies/list.yml")
			r.Write("policies/c.yml", toolPolicy("acme.c", "sea"))
			return r.Commit("second")
		}, []string{
			"policies/a.yaml#1 acme.a1 one",
			"policies/a.yaml#2 acme.a2 changed",
			"policies/c.yml#1 acme.c sea",
		}},
		{"delete a document", func() string {
			r.Write("policies/a.yaml", toolPolicy("acme.a2", "changed"))
			return r.Commit("third")
		}, []string{
			"policies/a.yaml#1 acme.a2 changed",
			"policies/c.yml#1 acme.c sea",
		}},
		{"unchanged", func() string { return r.Git("rev-parse", "HEAD") }, []string{
			"policies/a.yaml#1 acme.a2 changed",
			"policies/c.yml#1 acme.c sea",
		}},
		{"rename a file", func() string {
			r.Git("mv", "policies/c.yml", "policies/d.yml")
			return r.Commit("rename")
		}, []string{
			"policies/a.yaml#1 acme.a2 changed",
			"policies/d.yml#1 acme.c sea",
		}},
		{"declare a policy twice", func() string {
			r.Write("policies/e.yaml", toolPolicy("acme.c", "again"))
			return r.Commit("twice")
		}, []string{
			"policies/a.yaml#1 acme.a2 changed",
			"policies/d.yml#1 acme.c sea",
			"invalid policies/e.yaml#1 name: policy acme.c is also declared by policies/d.yml#1",
		}},
		{"delete everything", func() string {
			r.Remove("policies/a.yaml")
			r.Remove("policies/d.yml")
			r.Remove("policies/e.yaml")
			return r.Commit("fourth")
		}, nil},
	}
	for _, st := range steps {
		want := st.change()
		obs := observe(t, d)
		if obs.Revision != want {
			t.Errorf("%s: revision %s, want %s", st.name, obs.Revision, want)
		}
		got := declared(t, obs)
		for _, e := range obs.Invalid {
			got = append(got, fmt.Sprintf("invalid %s %s: %s", e.Object, e.Field, e.Message))
		}
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Errorf("%s: declared (-want +got):\n%s", st.name, diff)
		}
	}
	if _, err := os.Stat(filepath.Join(d.Dir(), "objects")); err != nil {
		t.Errorf("no bare repository in %s: %v", d.Dir(), err)
	}
	if got, want := d.Dir(), "sources/policies"; !strings.HasSuffix(got, want) {
		t.Errorf("Dir() = %s, want .../%s", got, want)
	}
	if got := d.LastNote(); got != "" {
		t.Errorf("LastNote() = %q after fast-forwards, want none", got)
	}
}

// TestObserveSameCommit: reading a commit again gives the same
// observation, whatever the caller did to the one before.
func TestObserveSameCommit(t *testing.T) {
	s := newServer(t, "")
	r := s.Repo(t, "same")
	r.Write("a.yaml", toolPolicy("acme.a", "a")+"labels: {tier: prod}\n---\nname: broken\nbogus: 1\n")
	r.Commit("one")
	d, _ := newDriver(t, s, Config{URL: r.URL})
	first := observe(t, d)
	want := *first
	want.Policies = slices.Clone(first.Policies)
	wantPolicy := *first.Policies[0].Policy
	wantPolicy.Labels = map[string]string{"tier": "prod"}
	wantPolicy.Spec = slices.Clone(first.Policies[0].Policy.Spec)
	want.Policies[0].Policy = &wantPolicy
	want.Invalid = slices.Clone(first.Invalid)

	first.Policies[0].Policy.Name = "changed"
	first.Policies[0].Policy.Labels["tier"] = "changed"
	first.Policies[0].Policy.Spec[0] = ' '
	first.Invalid[0].Message = "changed"
	second := observe(t, d)
	if diff := cmp.Diff(&want, second); diff != "" {
		t.Errorf("second observation (-want +got):\n%s", diff)
	}
}

// TestObserveInvalid: each content failure refuses the commit with an
// entry naming the file, the document and the field.
func TestObserveInvalid(t *testing.T) {
	s := newServer(t, "")
	good := toolPolicy("acme.good", "fine")
	tests := []struct {
		name  string
		setup func(r *repo)
		path  string
		want  []sources.ObjectError // Message is matched as a substring
	}{
		{"unknown field", func(r *repo) {
			r.Write("p/a.yaml", good+"---\n"+toolPolicy("acme.bad", "x")+"owner: platform\n")
		}, "p", []sources.ObjectError{{Object: "p/a.yaml#2", Name: "acme.bad", Field: "owner", Message: "unknown field"}}},
		{"wrong type", func(r *repo) {
			r.Write("p/a.json", `{"name":"acme.bad","kind":"ToolPolicy","scope":{"org":1},"spec":{}}`)
		}, "p", []sources.ObjectError{{Object: "p/a.json#1", Name: "acme.bad", Field: "scope.org", Message: "expected string, got number"}}},
		{"not yaml", func(r *repo) {
			r.Write("p/a.yaml", good+"---\nname: [x\n")
		}, "p", []sources.ObjectError{{Object: "p/a.yaml#2", Message: "not valid YAML"}}},
		{"not an object", func(r *repo) {
			r.Write("p/a.yaml", "just a string\n")
		}, "p", []sources.ObjectError{{Object: "p/a.yaml#1", Message: "document is not an object"}}},
		{"adopt not a boolean", func(r *repo) {
			r.Write("p/a.yaml", good+"adopt: \"yes\"\n")
		}, "p", []sources.ObjectError{{Object: "p/a.yaml#1", Name: "acme.good", Field: "adopt", Message: "expected boolean"}}},
		{"declared twice", func(r *repo) {
			r.Write("p/a.yaml", good)
			r.Write("p/b.yaml", good)
		}, "p", []sources.ObjectError{{Object: "p/b.yaml#1", Name: "acme.good", Field: "name", Message: "also declared by p/a.yaml#1"}}},
		{"over 1 MiB", func(r *repo) {
			r.Write("p/big.yaml", good+"# "+strings.Repeat("x", MaxFileSize)+"\n")
		}, "p", []sources.ObjectError{{Object: "p/big.yaml", Message: "over the limit of 1048576 (1 MiB)"}}},
		{"binary", func(r *repo) {
			r.Write("p/bin.yaml", good+"\x00\x01\x02")
		}, "p", []sources.ObjectError{{Object: "p/bin.yaml", Message: fmt.Sprintf("binary file (a NUL byte at offset %d)", len(good))}}},
		{"invalid UTF-8", func(r *repo) {
			r.Write("p/latin1.yaml", "# caf\xe9\n"+good)
		}, "p", []sources.ObjectError{{Object: "p/latin1.yaml", Message: "invalid UTF-8 at offset 5"}}},
		{"symlink above the root", func(r *repo) {
			r.Write("p/a.yaml", good)
			r.Symlink("p/out.yaml", "../../etc/passwd")
		}, "p", []sources.ObjectError{{Object: "p/out.yaml", Message: "symlink to ../../etc/passwd leaves the repository"}}},
		{"absolute symlink", func(r *repo) {
			r.Symlink("p/abs.yaml", "/etc/passwd")
		}, "p", []sources.ObjectError{{Object: "p/abs.yaml", Message: "symlink to /etc/passwd leaves the repository"}}},
		{"symlink out of the tree that is not a document", func(r *repo) {
			r.Write("p/a.yaml", good)
			r.Symlink("p/etc", "/etc")
		}, "p", []sources.ObjectError{{Object: "p/etc", Message: "symlink to /etc leaves the repository"}}},
		{"symlink chain out of the tree", func(r *repo) {
			r.Symlink("shared/hop.yaml", "../../outside.yaml")
			r.Symlink("p/a.yaml", "../shared/hop.yaml")
		}, "p", []sources.ObjectError{{Object: "p/a.yaml", Message: "symlink to ../../outside.yaml leaves the repository"}}},
		{"dangling symlink", func(r *repo) {
			r.Symlink("p/gone.yaml", "nowhere.yaml")
		}, "p", []sources.ObjectError{{Object: "p/gone.yaml", Message: "symlink to nowhere.yaml: no such file in the commit"}}},
		{"symlink to a directory", func(r *repo) {
			r.Write("shared/x.yaml", good)
			r.Symlink("p/dir.yaml", "../shared")
		}, "p", []sources.ObjectError{{Object: "p/dir.yaml", Message: "which is not a file"}}},
		{"symlink cycle", func(r *repo) {
			r.Symlink("p/a.yaml", "b.yaml")
			r.Symlink("p/b.yaml", "a.yaml")
		}, "p", []sources.ObjectError{
			{Object: "p/a.yaml", Message: "symlink chain longer than 8 links"},
			{Object: "p/b.yaml", Message: "symlink chain longer than 8 links"},
		}},
		{"no such path", func(r *repo) {
			r.Write("p/a.yaml", good)
		}, "policies", []sources.ObjectError{{Object: "policies", Message: "path policies is not a directory in commit"}}},
		{"path is a file", func(r *repo) {
			r.Write("p/a.yaml", good)
		}, "p/a.yaml", []sources.ObjectError{{Object: "p/a.yaml", Message: "is not a directory"}}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := s.Repo(t, fmt.Sprintf("invalid%d", i))
			tc.setup(r)
			rev := r.Commit(tc.name)
			d, _ := newDriver(t, s, Config{URL: r.URL, Path: tc.path})
			obs := observe(t, d)
			if obs.Revision != rev {
				t.Errorf("revision %s, want %s", obs.Revision, rev)
			}
			if len(obs.Invalid) != len(tc.want) {
				t.Fatalf("invalid = %+v, want %d entries like %+v", obs.Invalid, len(tc.want), tc.want)
			}
			for j, w := range tc.want {
				g := obs.Invalid[j]
				if !strings.Contains(g.Message, w.Message) {
					t.Errorf("invalid[%d].Message = %q, want it to contain %q", j, g.Message, w.Message)
				}
				g.Message, w.Message = "", ""
				if diff := cmp.Diff(w, g); diff != "" {
					t.Errorf("invalid[%d] (-want +got):\n%s", j, diff)
				}
			}
		})
	}
}

// TestObserveTooManyFiles: MaxFiles files under path are read; one more
// refuses the commit with one message, without reading them.
func TestObserveTooManyFiles(t *testing.T) {
	s := newServer(t, "")
	for _, n := range []int{MaxFiles, MaxFiles + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := s.Repo(t, fmt.Sprintf("many%d", n))
			files := map[string]string{"p/a.yaml": toolPolicy("acme.a", "a"), "outside.txt": "not counted"}
			for i := range n - 1 {
				files[fmt.Sprintf("p/d%02d/f%05d.txt", i%100, i)] = fmt.Sprint(i)
			}
			rev := r.ImportFiles(files)
			d, _ := newDriver(t, s, Config{URL: r.URL, Path: "p"})
			obs := observe(t, d)
			if obs.Revision != rev {
				t.Errorf("revision %s, want %s", obs.Revision, rev)
			}
			var want []sources.ObjectError
			wantDeclared := []string{"p/a.yaml#1 acme.a a"}
			if n > MaxFiles {
				want = []sources.ObjectError{{Object: "p", Message: "more than 10000 files under p: the commit is refused"}}
				wantDeclared = nil
			}
			if diff := cmp.Diff(want, obs.Invalid); diff != "" {
				t.Errorf("invalid (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantDeclared, declared(t, obs)); diff != "" {
				t.Errorf("declared (-want +got):\n%s", diff)
			}
		})
	}
}

// TestObserveSymlinkInTree: a symlink to a file of the same commit is read
// as that file, under the link's name.
func TestObserveSymlinkInTree(t *testing.T) {
	s := newServer(t, "")
	r := s.Repo(t, "links")
	r.Write("shared/base.yaml", toolPolicy("acme.shared", "shared"))
	r.Symlink("p/base.yaml", "../shared/base.yaml")
	r.Symlink("p/README", "../shared/base.yaml") // not a document: not read
	r.Commit("links")
	d, _ := newDriver(t, s, Config{URL: r.URL, Path: "p"})
	obs := observe(t, d)
	if len(obs.Invalid) > 0 {
		t.Fatalf("invalid %+v", obs.Invalid)
	}
	if diff := cmp.Diff([]string{"p/base.yaml#1 acme.shared shared"}, declared(t, obs)); diff != "" {
		t.Errorf("declared (-want +got):\n%s", diff)
	}
}

// TestObserveAdopt: a document's adopt sets Declared.Adopt and is not
// part of the policy.
func TestObserveAdopt(t *testing.T) {
	s := newServer(t, "")
	r := s.Repo(t, "adopt")
	r.Write("a.yaml", toolPolicy("acme.take", "t")+"adopt: true\n---\n"+toolPolicy("acme.leave", "l")+"adopt: false\n---\n"+toolPolicy("acme.plain", "p"))
	r.Write("b.json", `{"adopt":true,"name":"acme.json","kind":"ToolPolicy","scope":{},"spec":{"tool_name":"X","action":"deny","reason":"j"}}`)
	r.Commit("adopt")
	d, _ := newDriver(t, s, Config{URL: r.URL})
	obs := observe(t, d)
	if len(obs.Invalid) > 0 {
		t.Fatalf("invalid %+v", obs.Invalid)
	}
	want := []string{"a.yaml#1 acme.take t adopt", "a.yaml#2 acme.leave l", "a.yaml#3 acme.plain p", "b.json#1 acme.json j adopt"}
	if diff := cmp.Diff(want, declared(t, obs)); diff != "" {
		t.Errorf("declared (-want +got):\n%s", diff)
	}
}

// TestObserveTag: ref may name an annotated tag, which is peeled to its
// commit.
func TestObserveTag(t *testing.T) {
	s := newServer(t, "")
	r := s.Repo(t, "tags")
	r.Write("a.yaml", toolPolicy("acme.v1", "v1"))
	c1 := r.Commit("v1")
	r.Git("tag", "-a", "-m", "release", "v1")
	r.Git("push", "-q", "origin", "v1")
	r.Write("a.yaml", toolPolicy("acme.v2", "v2"))
	r.Commit("v2")
	d, _ := newDriver(t, s, Config{URL: r.URL, Ref: "v1"})
	obs := observe(t, d)
	if obs.Revision != c1 {
		t.Errorf("revision %s, want the tagged commit %s", obs.Revision, c1)
	}
	if diff := cmp.Diff([]string{"a.yaml#1 acme.v1 v1"}, declared(t, obs)); diff != "" {
		t.Errorf("declared (-want +got):\n%s", diff)
	}
}

// TestObserveFetchFailures: each failure to fetch is one line naming the
// source, the remote and the cause, with no observation.
func TestObserveFetchFailures(t *testing.T) {
	s := newServer(t, testToken)
	r := s.Repo(t, "fail")
	r.Write("a.yaml", toolPolicy("acme.a", "a"))
	r.Commit("one")
	empty := s.Repo(t, "empty")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/x.git"
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		cfg  Config
		anon bool // no token file
		want string
		is   error
	}{
		{"no auth", Config{URL: r.URL}, true, "authentication required (no auth is configured)", nil},
		{"unreachable", Config{URL: closed}, false, "connection refused", nil},
		{"bad token", Config{URL: r.URL, TokenFile: writeFile(t, "bad", "wrong-token\n")}, false, "the remote refused the token of auth.token_file", nil},
		{"no token", Config{URL: r.URL, TokenFile: filepath.Join(t.TempDir(), "missing")}, false, "read auth.token_file", nil},
		{"empty token", Config{URL: r.URL, TokenFile: writeFile(t, "empty", "\n")}, false, "is empty", nil},
		{"missing ref", Config{URL: r.URL, Ref: "nope"}, false, `no branch or tag "nope"`, ErrRefNotFound},
		{"empty repository", Config{URL: empty.URL}, false, "remote repository is empty", nil},
		{"no such repository", Config{URL: s.URL + "/absent.git"}, false, "repository not found", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := s
			if tc.anon {
				srv = nil
			}
			d, logs := newDriver(t, srv, tc.cfg)
			obs, err := d.Observe(t.Context())
			if obs != nil {
				t.Errorf("observation %+v, want none", obs)
			}
			var fe *FetchError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T), want a *FetchError", err, err)
			}
			msg := err.Error()
			t.Log(msg)
			for _, part := range []string{"git:policies", tc.cfg.URL, tc.want} {
				if !strings.Contains(msg, part) {
					t.Errorf("error %q does not name %q", msg, part)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q is more than one line", msg)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if strings.Contains(msg, testToken) || strings.Contains(logs.String(), testToken) {
				t.Errorf("the token leaked: %q / %q", msg, logs.String())
			}
		})
	}

	t.Run("password in the url", func(t *testing.T) {
		u := strings.Replace(closed, "http://", "http://user:hunter2@", 1)
		d, logs := newDriver(t, nil, Config{URL: u})
		_, err := d.Observe(t.Context())
		if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(logs.String(), "hunter2") {
			t.Errorf("error %v: want a failure without the password", err)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		d, _ := newDriver(t, s, Config{URL: r.URL})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		obs, err := d.Observe(ctx)
		if obs != nil || !errors.Is(err, context.Canceled) {
			t.Errorf("observed %+v, %v; want context.Canceled", obs, err)
		}
	})

	t.Run("token rotation", func(t *testing.T) {
		token := writeFile(t, "token", "wrong\n")
		d, _ := newDriver(t, s, Config{URL: r.URL, TokenFile: token})
		if _, err := d.Observe(t.Context()); err == nil {
			t.Fatal("observed with a wrong token")
		}
		if err := os.WriteFile(token, []byte(" "+testToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		observe(t, d)
	})
}

// TestObserveForcePush: a ref that moves to a commit that does not descend
// from the last one read is accepted, logged and noted until it moves
// forward again.
func TestObserveForcePush(t *testing.T) {
	s := newServer(t, "")
	r := s.Repo(t, "force")
	r.Write("a.yaml", toolPolicy("acme.a", "one"))
	c1 := r.Commit("one")
	r.Write("a.yaml", toolPolicy("acme.a", "two"))
	c2 := r.Commit("two")
	d, logs := newDriver(t, s, Config{URL: r.URL})
	if got := observe(t, d).Revision; got != c2 {
		t.Fatalf("revision %s, want %s", got, c2)
	}

	r.Git("reset", "-q", "--hard", c1) // the revert an operator pushes
	r.Git("push", "-q", "-f", "origin", "HEAD:refs/heads/main")
	if got := observe(t, d).Revision; got != c1 {
		t.Fatalf("after the force push: revision %s, want %s", got, c1)
	}
	note := d.LastNote()
	for _, part := range []string{"force-pushed", c2[:12], c1[:12]} {
		if !strings.Contains(note, part) {
			t.Errorf("LastNote() = %q, want it to name %q", note, part)
		}
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "old="+c2) || !strings.Contains(l, "new="+c1) {
		t.Errorf("no WARN naming both commits in:\n%s", l)
	}

	r.Write("a.yaml", toolPolicy("acme.a", "three"))
	c3 := r.Commit("rewritten")
	obs := observe(t, d)
	if obs.Revision != c3 {
		t.Fatalf("revision %s, want %s", obs.Revision, c3)
	}
	if got := d.LastNote(); got != "" {
		t.Errorf("LastNote() = %q after a fast-forward, want none", got)
	}
	if diff := cmp.Diff([]string{"a.yaml#1 acme.a three"}, declared(t, obs)); diff != "" {
		t.Errorf("declared (-want +got):\n%s", diff)
	}
}

// TestReport keeps the last outcomes and logs the ones not committed once.
func TestReport(t *testing.T) {
	d, logs := newDriver(t, nil, Config{URL: "https://git.example.com/p.git"})
	out := []sources.Outcome{
		{Object: "a.yaml#1", Name: "acme.a", State: sources.StateCommitted, Revision: 7},
		{Object: "a.yaml#2", Name: "acme.b", State: sources.StateConflict, Message: "owned by the API"},
	}
	d.Report(t.Context(), out)
	d.Report(t.Context(), out)
	if diff := cmp.Diff(out, d.Outcomes()); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	if got := strings.Count(logs.String(), "state=Conflict"); got != 1 {
		t.Errorf("conflict logged %d times, want once:\n%s", got, logs.String())
	}
	if slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(l string) bool { return strings.Contains(l, "acme.a ") }) {
		t.Errorf("a committed object was logged:\n%s", logs.String())
	}
}
