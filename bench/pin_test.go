package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		text    string
		wantErr bool
	}{
		{in: "0", want: []int{0}, text: "0"},
		{in: "1", want: []int{1}, text: "1"},
		{in: "0-3", want: []int{0, 1, 2, 3}, text: "0-3"},
		{in: "5,0-1,3", want: []int{0, 1, 3, 5}, text: "0-1,3,5"},
		{in: "2,1,2,0-1", want: []int{0, 1, 2}, text: "0-2"},
		{in: "1-1", want: []int{1}, text: "1"},
		{in: "1023", want: []int{1023}, text: "1023"},
		{in: "", wantErr: true},
		{in: "a", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "1-", wantErr: true},
		{in: "3-1", wantErr: true},
		{in: "0,,1", wantErr: true},
		{in: "0,", wantErr: true},
		{in: " 1", wantErr: true},
		{in: "01", wantErr: true},
		{in: "+1", wantErr: true},
		{in: "1024", wantErr: true},
		{in: "0-1-2", wantErr: true},
		{in: "0x1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var l cpuList
			err := l.Set(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Set(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, l.cpus); diff != "" {
				t.Errorf("Set(%q) CPUs (-want +got):\n%s", tt.in, diff)
			}
			if got := l.String(); got != tt.text {
				t.Errorf("Set(%q) String() = %q, want %q", tt.in, got, tt.text)
			}
		})
	}
}

func TestPinFlagsCheck(t *testing.T) {
	list := func(s string) cpuList {
		l, err := parseCPUList(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	allowed := []int{0, 1}
	tests := []struct {
		name       string
		pins       pinFlags
		allowedErr error
		wantErr    []string // substrings of the error; nil: no error
	}{
		{name: "not pinned", pins: pinFlags{}},
		{name: "not pinned, CPUs unknown", pins: pinFlags{}, allowedErr: errors.New("no affinity")},
		{name: "node and load", pins: pinFlags{node: list("0"), load: list("1")}},
		{name: "both on all", pins: pinFlags{node: list("0-1"), load: list("0-1")}},
		{name: "node CPU missing", pins: pinFlags{node: list("0,2-3")},
			wantErr: []string{"-node-cpus 0,2-3: CPU(s) 2-3 do not exist", "may use CPUs 0-1"}},
		{name: "load CPU missing", pins: pinFlags{node: list("0"), load: list("7")},
			wantErr: []string{"-load-cpus 7: CPU(s) 7 do not exist"}},
		{name: "CPUs unknown", pins: pinFlags{load: list("1")}, allowedErr: errors.New("no affinity"),
			wantErr: []string{"no affinity"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.pins.check(allowed, tt.allowedErr)
			if (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("check = %v, want error %v", err, tt.wantErr != nil)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("check = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestPropagationFigurePinned(t *testing.T) {
	f := &propagationFigure{Scenario: "propagation", Transport: "grpc", CPUs: 2}
	col := func(name string) string {
		t.Helper()
		for i, c := range f.columns() {
			if c == name {
				return f.row()[i]
			}
		}
		t.Fatalf("no column %q", name)
		return ""
	}
	if got := col("scenario") + " | " + col("cpus"); got != "propagation | 2 shared" {
		t.Errorf("unpinned row: %q", got)
	}
	if got := f.targets()[0].Target; strings.Contains(got, "pinned") {
		t.Errorf("unpinned target %q says pinned", got)
	}
	f.NodeCPUs, f.LoadCPUs = "0", "1"
	if got := col("scenario") + " | " + col("cpus"); got != "propagation pinned | node 0, load 1" {
		t.Errorf("pinned row: %q", got)
	}
	if got := f.targets()[0].Target; !strings.Contains(got, "pinned: node CPU(s) 0, load CPU(s) 1") {
		t.Errorf("pinned target %q does not say so", got)
	}
}
