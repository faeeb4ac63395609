package main

import (
	"strings"
	"testing"
)

func TestImpactValidate(t *testing.T) {
	tests := []struct {
		name    string
		c       impactConfig
		mention string
	}{
		{"defaults", impactConfig{records: 1_000_000, procs: 1}, ""},
		{"no records", impactConfig{records: 0, procs: 1}, "-records"},
		{"no procs", impactConfig{records: 10, procs: 0}, "-procs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.validate()
			if tc.mention == "" && err != nil || tc.mention != "" && (err == nil || !strings.Contains(err.Error(), tc.mention)) {
				t.Fatalf("validate = %v, want an error mentioning %q", err, tc.mention)
			}
		})
	}
}

// TestImpactScenarioSmall runs the scenario on a small log: the replay
// reads back every record it wrote and finds flips both ways; a figure off
// the target's size carries no target.
func TestImpactScenarioSmall(t *testing.T) {
	var got []figure
	env := &runEnv{workDir: t.TempDir(), logf: t.Logf, emit: func(f figure) error { got = append(got, f); return nil }}
	c := &impactConfig{records: 5000, procs: 1}
	if err := c.run(t.Context(), env); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d figures, want 1", len(got))
	}
	f := got[0].(*impactFigure)
	if f.Evaluated == 0 || f.AllowToDeny == 0 || f.DenyToAllow == 0 || f.Errors != 0 || f.Unrecorded == 0 {
		t.Errorf("figure %+v: want evaluated records, flips both ways, no errors, unrecorded decisions", f)
	}
	if f.targets() != nil {
		t.Errorf("targets %v for %d records, want none", f.targets(), f.Records)
	}
	f.Records, f.Target, f.TargetMet, f.ReplayS = 1_000_000, "< 1m0s", true, 8.4
	if ts := f.targets(); len(ts) != 1 || !ts[0].Met || !strings.Contains(ts[0].Measured, "8.4 s") {
		t.Errorf("targets %+v", ts)
	}
}
