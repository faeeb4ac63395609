package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// profileNodes starts, after delay, a CPU profile of length d on every
// node of cl (GET /debug/pprof/profile, admin role) and returns a function
// that waits for them and writes each to dir/<node>-<role>-<tag>.pprof,
// role being leader or follower. Read them with `go tool pprof -top
// <binary> <file>`.
func profileNodes(ctx context.Context, cl *cluster, leader, dir, tag string, delay, d time.Duration) func() error {
	secs := max(1, int(d.Seconds()))
	client := &http.Client{Timeout: d + delay + 30*time.Second, Transport: withBearer(&http.Transport{Proxy: nil}, cl.token)}
	errs := make([]error, len(cl.nodes))
	var wg sync.WaitGroup
	for i, nd := range cl.nodes {
		path := nodeFile(dir, nd, leader, tag, ".pprof")
		wg.Go(func() {
			if err := sleepUntil(ctx, time.Now().Add(delay)); err != nil {
				errs[i] = err
				return
			}
			errs[i] = fetchProfile(ctx, client, "http://"+nd.httpAddr+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), path)
		})
	}
	return func() error {
		wg.Wait()
		client.CloseIdleConnections()
		return errors.Join(errs...)
	}
}

// nodeFile is where a node's output of a run goes:
// dir/<node>-<leader|follower>-<tag><ext>.
func nodeFile(dir string, nd *node, leader, tag, ext string) string {
	role := "follower"
	if nd.id == leader {
		role = "leader"
	}
	return filepath.Join(dir, nd.id+"-"+role+"-"+tag+ext)
}

// saveNodeMetrics writes every node's GET /metrics text to dir as
// <node>-<role>-<tag>.metrics. Raft's go-metrics summaries there (commit
// time, log store, FSM apply, AppendEntries RPC) break a write's latency
// down by stage.
func saveNodeMetrics(ctx context.Context, cl *cluster, leader, dir, tag string) error {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	var errs []error
	for _, nd := range cl.nodes {
		body, err := fetchMetrics(ctx, client, nd.httpAddr)
		if err == nil {
			err = os.WriteFile(nodeFile(dir, nd, leader, tag, ".metrics"), body, 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", nd.id, err))
		}
	}
	return errors.Join(errs...)
}

// fetchProfile GETs url and writes the body to path.
func fetchProfile(ctx context.Context, client *http.Client, url, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create profile dir: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: status %d: %s", url, resp.StatusCode, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
