package server

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/poll"
)

// TestMeasureReadyAfterRestart measures, on a 3-node cluster, the time from
// a node's restart to its first /readyz 200 with N policies in the log:
//
//   - missed: a follower stopped before the N writes, restarted after them
//     (it catches up by replication or a snapshot install);
//   - current: a follower stopped after it applied all N, restarted.
//
// It runs only when POLICYD_MEASURE_READY=N is set (writing stops after
// POLICYD_MEASURE_WRITE_FOR, default 3m, with what was written):
//
//	POLICYD_MEASURE_READY=100000 go test -count=1 -run TestMeasureReadyAfterRestart -v -timeout 30m ./internal/server/
func TestMeasureReadyAfterRestart(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("POLICYD_MEASURE_READY"))
	if n <= 0 {
		t.Skip("set POLICYD_MEASURE_READY=N to measure")
	}
	writeFor := 3 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("POLICYD_MEASURE_WRITE_FOR")); err == nil {
		writeFor = d
	}
	// The release's Raft timeouts, not the tests' short ones: on a shared
	// two-core machine under a write flood those cause needless elections.
	c := newCluster(t, 3, func(cfg *config.Config) {
		d := config.Default()
		cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout = d.Raft.HeartbeatTimeout, d.Raft.ElectionTimeout
		cfg.Raft.LeaderLeaseTimeout, cfg.Raft.CommitTimeout = d.Raft.LeaderLeaseTimeout, d.Raft.CommitTimeout
		cfg.Raft.ApplyTimeout, cfg.Forward.Timeout = d.Raft.ApplyTimeout, d.Forward.Timeout
	})
	missed := indexOf(c, c.follower())
	c.stop(missed)

	written := writeMany(t, c.leader(), n, writeFor)
	t.Logf("wrote %d policies in the log (%d asked)", written, n)

	measure := func(name string, i int) {
		start := time.Now()
		restarted := c.restart(i)
		up := time.Since(start)
		a := apiFor(t, restarted)
		poll.Eventually(t, name+" node's /readyz 200", func() error {
			if r := a.do(http.MethodGet, "/readyz", nil, nil); r.status != http.StatusOK {
				return fmt.Errorf("/readyz %d %s", r.status, r.body)
			}
			return nil
		}, poll.Within(10*time.Minute))

		t.Logf("%s: restart to /readyz 200 in %v (New+Start %v), applied index %d",
			name, time.Since(start).Round(time.Millisecond), up.Round(time.Millisecond), restarted.store.AppliedIndex())
	}
	measure("missed all writes", missed)
	c.waitConverged()
	current := indexOf(c, c.follower())
	c.stop(current)
	measure("held all writes", current)
}

// writeMany PUTs up to n small policies through node l with concurrent
// writers, for at most d, and returns how many were acknowledged.
func writeMany(t *testing.T, l *Node, n int, d time.Duration) int {
	t.Helper()
	const writers = 32
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: writers}}
	defer hc.CloseIdleConnections()
	base := "http://" + l.HTTPAddr() + "/v1/policies/"
	var next, acked atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var failed atomic.Value
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				name := fmt.Sprintf("m-%06d", i)
				if err := putUntil(hc, base+name, toolPolicy(name, "acme", "r"), time.Now().Add(time.Minute)); err != nil {
					failed.Store(err)
					return
				}
				acked.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("write: %v", err)
	}
	return int(acked.Load())
}

// putUntil PUTs body to url, again after a 503 or a transport error (an
// election under load: on a loaded machine two voters of three lose their
// leader now and then), until the deadline. Each name is written by one
// writer, so a retry of a write that was in fact committed only bumps its
// revision.
func putUntil(hc *http.Client, url string, body []byte, deadline time.Time) error {
	for {
		req, err := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("PUT %s: %d", url, resp.StatusCode)
			if resp.StatusCode != http.StatusServiceUnavailable {
				return err
			}
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}
