package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/policyd/policyd/client"
)

// recordingClient is a client that was never run: it denies everything,
// and records every decision.
func recordingClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Servers: []string{"127.0.0.1:1"},
		DecisionLog: &client.DecisionLog{RatePerSecond: 1e12, Burst: math.MaxInt32}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// evaluate decides calls to tools t<from>…t<to-1>.
func evaluate(c *client.Client, from, to int) {
	for i := from; i < to; i++ {
		c.Evaluate(context.Background(), client.Request{Tool: fmt.Sprintf("t%d", i), Input: map[string]any{"pad": strings.Repeat("x", 200)}})
	}
}

// toolsOf decodes records and returns their tools.
func toolsOf(t *testing.T, records [][]byte) []string {
	t.Helper()
	out := []string{}
	for _, b := range records {
		var r client.DecisionRecord
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("record %q: %v", b, err)
		}
		out = append(out, r.Request.Tool)
	}
	return out
}

func toolRange(from, to int) []string {
	out := []string{}
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("t%d", i))
	}
	return out
}

// TestDecisionSpool: records spilled go out in order; what was shipped is
// remembered across a restart, and what was peeked but not shipped comes
// again.
func TestDecisionSpool(t *testing.T) {
	dir := t.TempDir()
	logger := slog.New(slog.DiscardHandler)
	c := recordingClient(t)
	sp, err := openSpool(dir, minDecisionDirMaxBytes, logger)
	if err != nil {
		t.Fatal(err)
	}
	evaluate(c, 0, 5)
	sp.spill(c)
	evaluate(c, 5, 8)
	sp.spill(c)
	if s := c.DecisionLogStats(); s.BufferedRecords != 0 || s.Taken != 8 {
		t.Fatalf("SDK stats after a spill: %+v", s)
	}
	got, err := sp.Peek(3, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(toolRange(0, 3), toolsOf(t, got)); diff != "" {
		t.Fatalf("first peek (-want +got):\n%s", diff)
	}
	if err := sp.Shipped(2); err != nil {
		t.Fatal(err)
	}
	if err := sp.close(); err != nil {
		t.Fatal(err)
	}

	sp, err = openSpool(dir, minDecisionDirMaxBytes, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.close() })
	got, err = sp.Peek(100, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(toolRange(2, 8), toolsOf(t, got)); diff != "" {
		t.Fatalf("peek after a restart (-want +got):\n%s", diff)
	}
	// A peek bounded by bytes stops before the record that does not fit.
	if got, _ := sp.Peek(100, len(got[0])+len(got[1])+1); len(got) != 2 {
		t.Errorf("peek of two records' bytes gave %d", len(got))
	}
	if err := sp.Shipped(2); err != nil {
		t.Fatal(err)
	}
	if err := sp.Shipped(3); err == nil {
		t.Error("shipping more than peeked: no error")
	}
	got, _ = sp.Peek(100, math.MaxInt)
	if diff := cmp.Diff(toolRange(4, 8), toolsOf(t, got)); diff != "" {
		t.Fatalf("peek after shipping (-want +got):\n%s", diff)
	}
}

// TestDecisionSpoolRing: the ring keeps near its size, dropping the
// oldest records, and the cursor of a dropped segment resumes at the
// oldest kept.
func TestDecisionSpoolRing(t *testing.T) {
	dir := t.TempDir()
	c := recordingClient(t)
	sp, err := openSpool(dir, minDecisionDirMaxBytes, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.close() })
	const n = 20_000 // about 10 MiB of records
	for i := 0; i < n; i += 1000 {
		evaluate(c, i, i+1000)
		sp.spill(c)
	}
	if b := sp.store.Bytes(); b > minDecisionDirMaxBytes+int64(sp.takeBytes)+minDecisionDirMaxBytes/8 {
		t.Errorf("ring of %d bytes, over its %d cap and a segment", b, minDecisionDirMaxBytes)
	}
	got, err := sp.Peek(math.MaxInt, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	tools := toolsOf(t, got)
	if len(tools) == 0 || len(tools) >= n || tools[len(tools)-1] != fmt.Sprintf("t%d", n-1) {
		t.Fatalf("ring holds %d records ending %v; want the newest, not all", len(tools), tools[max(0, len(tools)-1):])
	}
	var first int
	if _, err := fmt.Sscanf(tools[0], "t%d", &first); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(toolRange(first, n), tools); diff != "" {
		t.Errorf("ring (-want +got):\n%s", diff)
	}
}

func TestDecisionLogFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
		spool   bool
	}{
		{"off", nil, "", false},
		{"on", []string{"--decision-log"}, "", false},
		{"with a dir", []string{"--decision-log", "--decision-log-dir", "DIR"}, "", true},
		{"rate without the log", []string{"--decision-log-allow-rate", "1"}, "--decision-log-allow-rate needs --decision-log", false},
		{"dir without the log", []string{"--decision-log-dir", "DIR"}, "--decision-log-dir needs --decision-log", false},
		{"rate over 1", []string{"--decision-log", "--decision-log-allow-rate", "1.5"}, "not in [0, 1]", false},
		{"size without a dir", []string{"--decision-log", "--decision-log-dir-max-bytes", "2000000"}, "needs --decision-log-dir", false},
		{"ring too small", []string{"--decision-log", "--decision-log-dir", "DIR", "--decision-log-dir-max-bytes", "1000"}, "below 1048576", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "spool")
			f := pflag.NewFlagSet("authz", pflag.ContinueOnError)
			var df decisionLogFlags
			df.register(f)
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				args[i] = strings.ReplaceAll(a, "DIR", dir)
			}
			if err := f.Parse(args); err != nil {
				t.Fatal(err)
			}
			dl, sp, err := df.config(f, slog.New(slog.DiscardHandler))
			if tc.wantErr != "" {
				var ue *usageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("config = %v, want a usage error about %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (dl != nil) != df.on || (sp != nil) != tc.spool {
				t.Fatalf("log %v, spool %v", dl, sp)
			}
			if sp != nil {
				t.Cleanup(func() { _ = sp.close() })
				if dl.Source == nil {
					t.Error("the spool is not the SDK's source")
				}
				if _, err := os.Stat(filepath.Join(dir, "ring")); err != nil {
					t.Error(err)
				}
			}
			if dl != nil && *dl.AllowSampleRate != defaultDecisionAllowRate {
				t.Errorf("allow rate %v", *dl.AllowSampleRate)
			}
		})
	}
}
