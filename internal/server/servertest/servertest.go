// Package servertest holds what tests outside package server need to run a
// policyd node (server.New) on loopback, and what they need to observe one
// (metrics, goroutines, HTTP/2 frames). It is for tests only: _test.go files
// import it, the policyd binary never does.
package servertest

import (
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/policyd/policyd/internal/config"
)

// Config is a node that listens on loopback with free ports and stores in
// dataDir, with Raft timeouts short enough for tests (hashicorp/raft's own
// tests go lower) but safe under -race on two cores. It does not bootstrap:
// the caller sets Raft.Bootstrap on the first node of a cluster.
func Config(dataDir, id string) config.Config {
	cfg := config.Default()
	cfg.NodeID = id
	cfg.DataDir = dataDir
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.GRPC.Addr = "127.0.0.1:0"
	cfg.Raft.Addr = "127.0.0.1:0"
	cfg.Raft.Bootstrap = false
	cfg.Raft.HeartbeatTimeout = 300 * time.Millisecond
	cfg.Raft.ElectionTimeout = 300 * time.Millisecond
	cfg.Raft.LeaderLeaseTimeout = 150 * time.Millisecond
	cfg.Raft.CommitTimeout = 5 * time.Millisecond
	cfg.Raft.ApplyTimeout = 5 * time.Second
	cfg.Forward.Timeout = 5 * time.Second
	cfg.Log.Level = "warn"
	return cfg
}

// Logger logs to t.Log, so a node's logs show only for a failing test, at
// warn level, or debug with POLICYD_TEST_DEBUG set.
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("POLICYD_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if _, ok := t.(*testing.F); ok {
		// A fuzz target's node logs while the target runs, where a
		// *testing.F may not be used: f.Log would panic.
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, opts))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Goroutines counts the goroutines whose stack mentions any of funcs (e.g.
// "internal/server/feed.(*conn)."): how tests show that idle connections cost no
// goroutine.
func Goroutines(funcs ...string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for _, f := range funcs {
			if strings.Contains(g, f) {
				count++
				break
			}
		}
	}
	return count
}

// Metric sums a metric's series in g, those carrying every label of labels
// (name, value pairs): a counter's or gauge's value, a histogram's sample
// count. 0 if no series matches.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m.GetLabel(), labels) {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(have []*dto.LabelPair, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, lp := range have {
			found = found || lp.GetName() == want[i] && lp.GetValue() == want[i+1]
		}
		if !found {
			return false
		}
	}
	return true
}

// CleanEnv is the environment without POLICYD_* variables, for a policyd
// process a test starts: they would override its config file.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "POLICYD_") {
			env = append(env, kv)
		}
	}
	return env
}
