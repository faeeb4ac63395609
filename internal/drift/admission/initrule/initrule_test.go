package initrule

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    Rule
		wantErr string
	}{
		{in: "apps/Deployment=Available+observedGeneration", want: Rule{Group: "apps", Kind: "Deployment", Conditions: []string{"Available"}, ObservedGeneration: true}},
		{in: "/Pod=Ready", want: Rule{Kind: "Pod", Conditions: []string{"Ready"}}},
		{in: "example.com/Widget=Synced+Ready+readyReplicas", want: Rule{Group: "example.com", Kind: "Widget", Conditions: []string{"Synced", "Ready"}, ReadyReplicas: true}},
		{in: " apps/Deployment=default ", want: Rule{Group: "apps", Kind: "Deployment", Default: true}},
		{in: "example.com/Widget=infra.example.com/Healthy", want: Rule{Group: "example.com", Kind: "Widget", Conditions: []string{"infra.example.com/Healthy"}}},

		{in: "Widget=Ready", wantErr: "not group/Kind"},
		{in: "apps/Deployment", wantErr: "want group/Kind=Signal"},
		{in: "apps/=Ready", wantErr: "not group/Kind"},
		{in: "a/b/C=Ready", wantErr: "not group/Kind"},
		{in: "apps/Deployment=", wantErr: "unknown signal"},
		{in: "apps/Deployment=Ready++Available", wantErr: `unknown signal ""`},
		{in: "apps/Deployment=Ready Now", wantErr: `unknown signal "Ready Now"`},
		{in: "apps/Deployment=ready", wantErr: "starts with an upper-case letter"},
		{in: "apps/Deployment=available+observedGeneration", wantErr: `unknown signal "available"`},
		{in: "apps/Deployment=ObservedGeneration", wantErr: "did you mean observedGeneration?"},
		{in: "apps/Deployment=readyreplicas", wantErr: "did you mean readyReplicas?"},
		{in: "apps/Deployment=Default", wantErr: "did you mean default?"},
		{in: "apps/Deployment=Example.com/Ready", wantErr: "not a DNS prefix"},
		{in: "apps/Deployment=example.com/ready", wantErr: "starts with an upper-case letter"},
		{in: "apps/Deployment=default+Ready", wantErr: "stands alone"},
		{in: "apps/Deployment=observedGeneration+default", wantErr: "stands alone"},
		{in: "apps/Deployment=default+default", wantErr: "stands alone"},
		{in: "apps/Deployment=" + strings.Repeat("A", 317), wantErr: "unknown signal"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Parse(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), "initialization rule") {
					t.Errorf("err %q does not say which rule", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestExampleRules parses the rules config.example.yaml shows.
func TestExampleRules(t *testing.T) {
	data, err := os.ReadFile("../../../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "#   initialization:":
			in = true
		case in && strings.HasPrefix(trimmed, "#     - "):
			rules = append(rules, strings.TrimPrefix(trimmed, "#     - "))
		default:
			in = false
		}
	}
	if len(rules) < 2 {
		t.Fatalf("found %q, want the example's rules", rules)
	}
	for _, r := range rules {
		if _, err := Parse(r); err != nil {
			t.Errorf("example rule: %v", err)
		}
	}
}

// FuzzParse: any text parses to a rule that names a kind or to an error,
// never a panic, and default never comes with other signals.
//
//	go test ./internal/drift/admission/initrule -run '^$' -fuzz FuzzParse -fuzztime 1m
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"apps/Deployment=default", "apps/Deployment=Available+observedGeneration", "/Pod=Ready",
		"example.com/Widget=infra.example.com/Healthy+readyReplicas", "apps/Deployment=default+Ready",
		"a/b/C=Ready", "=", "/=", "apps/Deployment=ready", "x/Y=.-/Z", "\x00/\xff=\xfe",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(s)
		if err != nil {
			return
		}
		if r.Kind == "" {
			t.Fatalf("Parse(%q) = %+v without a kind", s, r)
		}
		if r.Default && (len(r.Conditions) > 0 || r.ObservedGeneration || r.ReadyReplicas) {
			t.Fatalf("Parse(%q) = %+v: default with other signals", s, r)
		}
	})
}
