package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/adminclient"
)

func TestCellIsInert(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "-"},
		{"rm -rf /", "rm -rf /"},
		{"a\tb\nc", "a?b?c"},
		{"\x1b[31mred\x1b[0m", "?[31mred?[0m"},
		{"bad \xff byte", "bad ? byte"},
		{strings.Repeat("é", 100), strings.Repeat("é", 79) + "…"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := cell(tc.in); got != tc.want {
				t.Errorf("cell(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestFlagTime(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		bad  bool
	}{
		{"", time.Time{}, false},
		{"1h", now.Add(-time.Hour), false},
		{"2026-12-04T10:00:00Z", time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC), false},
		{"-1h", time.Time{}, true},
		{"yesterday", time.Time{}, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := flagTime("since", tc.in, now)
			var ue *usageError
			if tc.bad != (err != nil) || (err != nil && !errors.As(err, &ue)) {
				t.Fatalf("flagTime(%q) error %v, want a usage error: %v", tc.in, err, tc.bad)
			}
			if !got.Equal(tc.want) {
				t.Errorf("flagTime(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestImpactTable(t *testing.T) {
	rep := &adminclient.ImpactReport{
		Totals:           adminclient.ImpactCounts{Evaluated: 100, AllowToDeny: 10, Unchanged: 90},
		AllowToDenyRatio: 0.1,
		Teams: []adminclient.ImpactTeam{{Org: "acme", Team: "red", ImpactCounts: adminclient.ImpactCounts{Evaluated: 100, AllowToDeny: 10, Unchanged: 90},
			AllowToDenyExamples: []adminclient.DecisionRecord{{Employee: "e1", Allowed: true, Request: adminclient.DecisionRequest{Tool: "Bash\x1b]0;pwned\x07"}}}}},
		Unavailable: []string{"node3"},
	}
	var b bytes.Buffer
	if err := impactTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"acme", "TOTAL", "allow→deny ratio 0.1000", "allow→deny examples of acme/red", "Bash?]0;pwned?", "node3"} {
		if !strings.Contains(out, want) {
			t.Errorf("impact table lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsRune(out, '\x1b') {
		t.Errorf("impact table holds an escape character:\n%q", out)
	}
}
