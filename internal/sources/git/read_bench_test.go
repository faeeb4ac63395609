package git

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
)

// BenchmarkRead reads a commit of 5,000 policies of about 4 KB in 100
// files from the local object store, once the fetch is done: every file
// new (a first read), and every file decoded before (a push that changed
// other files).
//
//	go test ./internal/sources/git/ -run '^$' -bench BenchmarkRead -benchmem
func BenchmarkRead(b *testing.B) {
	s := newServer(b, "")
	r := s.Repo(b, "bench")
	pad := strings.Repeat("x", 3900)
	files := map[string]string{}
	for f := range 100 {
		var doc strings.Builder
		for i := range 50 {
			fmt.Fprintf(&doc, "---\n%s  pad: %s\n", toolPolicy(fmt.Sprintf("acme.p%02d-%02d", f, i), "r"), pad)
		}
		files[fmt.Sprintf("p/f%02d.yaml", f)] = doc.String()
	}
	rev := r.ImportFiles(files)
	d, _ := newDriver(b, s, Config{URL: r.URL, Path: "p"})
	if _, err := d.Observe(b.Context()); err != nil {
		b.Fatal(err)
	}
	commit, err := peel(d.repo, plumbing.NewHash(rev))
	if err != nil {
		b.Fatal(err)
	}
	for _, cold := range []bool{true, false} {
		name := "unchanged files"
		if cold {
			name = "every file new"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if cold {
					d.decoded = nil
				}
				obs, err := d.read(commit)
				if err != nil || len(obs.Policies) != 5000 || len(obs.Invalid) != 0 {
					b.Fatalf("%d policies, %d invalid, %v", len(obs.Policies), len(obs.Invalid), err)
				}
			}
		})
	}
}
