package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/internal/loopback"
)

// etcdMembers is the size of the etcd cluster, the same as the writes
// scenario's policyd cluster.
const etcdMembers = writesNodes

// Issue targets for policyd against etcd, in the same run.
const (
	targetThroughputRatio = 1.5                    // policyd writes/s ÷ etcd writes/s, -writers writers
	targetWritesP99       = 100 * time.Millisecond // policyd p99 at -writers writers
)

// etcdConfig holds the etcd scenario's flags: the writes workload's, plus
// where etcd comes from.
type etcdConfig struct {
	writesConfig
	etcdBin string
	policyd bool
}

// etcdScenario runs the writes workload (same writers, keys, value size and
// duration) against a 3-member etcd cluster on loopback that it starts and
// stops itself: writer w's i-th write is a Put of the same policy body
// under the same key name, to member (w+i) mod 3 (each member has its own
// client, so that a follower forwards as a policyd follower does). With
// -policyd (the default) it first runs the same workload against policyd,
// and then prints the ratio of the two per writer count.
//
// etcd runs with its defaults, which match policyd's durability: every
// entry is fsynced to the WAL before it is acknowledged (policyd fsyncs
// its Raft log, see internal/server/raftnode/raft.go).
func etcdScenario() scenario {
	return scenario{
		name:    "etcd",
		summary: "the writes workload against policyd and a 3-member etcd, and the ratio",
		setup: func(fs *flag.FlagSet) runner {
			c := &etcdConfig{}
			c.register(fs)
			fs.StringVar(&c.etcdBin, "etcd-bin", "", "etcd binary; empty: the one hack/kube-bins.sh builds (v3.6.4, cached)")
			fs.BoolVar(&c.policyd, "policyd", true, "also run the workload against policyd first and print the ratio")
			return c
		},
	}
}

func (c *etcdConfig) validate() error { return c.writesConfig.validate() }

func (c *etcdConfig) run(ctx context.Context, env *runEnv) error {
	var pd []*writesFigure
	if c.policyd {
		var err error
		if pd, err = c.runPolicyd(ctx, env); err != nil {
			return fmt.Errorf("policyd: %w", err)
		}
	}
	bin, err := c.resolveEtcd(ctx, env)
	if err != nil {
		return err
	}
	ed, err := c.runEtcd(ctx, env, bin)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	for _, f := range compareWrites(pd, ed, c.writers) {
		if err := env.emit(f); err != nil {
			return err
		}
	}
	return nil
}

// resolveEtcd returns -etcd-bin, or the etcd that hack/kube-bins.sh
// builds (it waits while another process builds it).
func (c *etcdConfig) resolveEtcd(ctx context.Context, env *runEnv) (string, error) {
	if c.etcdBin != "" {
		abs, err := filepath.Abs(c.etcdBin)
		if err != nil {
			return "", fmt.Errorf("-etcd-bin: %w", err)
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("-etcd-bin: %w", err)
		}
		return abs, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	env.logf("finding etcd with hack/kube-bins.sh (builds it once, from the Go module proxy)")
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "kube-bins.sh"))
	cmd.Dir = root
	cmd.Stderr = env.stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/kube-bins.sh: %w (or pass -etcd-bin)", err)
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "etcd")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("etcd from hack/kube-bins.sh: %w (or pass -etcd-bin)", err)
	}
	return bin, nil
}

// runEtcd starts an etcd cluster, runs the workload once per writer count
// and emits a figure per run.
func (c *etcdConfig) runEtcd(ctx context.Context, env *runEnv, bin string) (figs []*writesFigure, err error) {
	cfg := c.writesConfig
	env.logf("starting a %d-member etcd cluster (%s) in %s", etcdMembers, bin, env.workDir)
	ec, err := startEtcd(bin, env.workDir, etcdMembers, env.nodeCPUs)
	if err != nil {
		return nil, err
	}
	writeErrors := false
	defer func() {
		env.logf("stopping etcd")
		if stopErr := ec.stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stop etcd: %w", stopErr))
		}
		if err != nil && ctx.Err() == nil || writeErrors {
			ec.dumpLogs(env.stderr)
		}
	}()

	clients := make([]*clientv3.Client, len(ec.nodes))
	defer func() {
		for _, cli := range clients {
			if cli != nil {
				_ = cli.Close()
			}
		}
	}()
	for i, nd := range ec.nodes {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{"http://" + nd.httpAddr},
			DialTimeout: 5 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return nil, fmt.Errorf("etcd client for %s: %w", nd.id, err)
		}
		clients[i] = cli
	}
	readyStart := time.Now()
	leaderIdx, err := etcdLeader(ctx, ec, clients, env.readyTimeout)
	if err != nil {
		return nil, err
	}
	env.logf("etcd ready in %v, leader %s", time.Since(readyStart).Round(time.Millisecond), ec.nodes[leaderIdx].id)

	write := etcdWrite(clients, cfg.timeout)
	if err := write(ctx, 0, "bench-preflight", policyBody(nil, "bench-preflight", 0, cfg.valueSize)); err != nil {
		return nil, fmt.Errorf("preflight put: %w", err)
	}
	for _, writers := range cfg.writerCounts() {
		if leaderIdx, err = etcdLeader(ctx, ec, clients, env.readyTimeout); err != nil {
			return figs, err
		}
		env.logf("etcd writes: %d writer(s), %d keys each, %d-byte values, warmup %v, measuring %v",
			writers, cfg.keys, cfg.valueSize, cfg.warmup, cfg.duration)
		res, err := writeLoad(ctx, ec, write, len(clients), leaderIdx, cfg, writers)
		if err != nil {
			return figs, fmt.Errorf("%d-writer run: %w", writers, err)
		}
		if err := ec.checkAlive(); err != nil {
			return figs, fmt.Errorf("after the %d-writer run: %w", writers, err)
		}
		f := res.figure(cfg, writers)
		f.Scenario = "etcd"
		if err := env.emit(f); err != nil {
			return figs, err
		}
		figs = append(figs, f)
		writeErrors = res.logErrors(env) || writeErrors
	}
	return figs, nil
}

// etcdWrite puts the value with clients[target], one client per member.
func etcdWrite(clients []*clientv3.Client, timeout time.Duration) writeFunc {
	return func(ctx context.Context, target int, name string, body []byte) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := clients[target].Put(ctx, name, string(body))
		if err == nil || ctx.Err() != nil {
			return err
		}
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unavailable {
			return &statusError{code: st.Code().String(), msg: st.Message()}
		}
		return err
	}
}

// startEtcd starts members etcd processes on loopback under dir/etcdN,
// forming a new cluster, with etcd's defaults otherwise (fsync on), each
// pinned to cpus as the policyd nodes are ("": not pinned).
func startEtcd(bin, dir string, members int, cpus string) (_ *cluster, err error) {
	ports, err := loopback.FreePorts(2 * members)
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, binary: bin}
	var initial []string
	for i := range members {
		nd := &node{id: "etcd" + strconv.Itoa(i+1), httpAddr: loopback.Addr(ports[2*i]), raftAddr: loopback.Addr(ports[2*i+1]), termIsClean: true, cpus: cpus}
		nd.dir = filepath.Join(dir, nd.id)
		nd.logPath = filepath.Join(nd.dir, "etcd.log")
		c.nodes = append(c.nodes, nd)
		initial = append(initial, nd.id+"=http://"+nd.raftAddr)
	}
	for _, nd := range c.nodes {
		if err := os.MkdirAll(nd.dir, 0o755); err != nil {
			return nil, fmt.Errorf("%s: create dir: %w", nd.id, err)
		}
		nd.args = []string{
			"--name", nd.id,
			"--data-dir", filepath.Join(nd.dir, "data"),
			"--listen-client-urls", "http://" + nd.httpAddr,
			"--advertise-client-urls", "http://" + nd.httpAddr,
			"--listen-peer-urls", "http://" + nd.raftAddr,
			"--initial-advertise-peer-urls", "http://" + nd.raftAddr,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", "policyd-bench",
			"--log-level", "warn",
		}
	}
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	for _, nd := range c.nodes {
		if err := nd.start(bin, nil); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// etcdLeader waits (up to timeout) until every member answers a status
// request naming the same leader, and returns the leader's index.
func etcdLeader(ctx context.Context, ec *cluster, clients []*clientv3.Client, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := ec.checkAlive(); err != nil {
			return 0, err
		}
		idx, notReady := etcdLeaderOnce(ctx, ec, clients)
		if notReady == nil {
			return idx, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return 0, fmt.Errorf("etcd not ready after %v: %w", timeout, notReady)
			}
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}

func etcdLeaderOnce(ctx context.Context, ec *cluster, clients []*clientv3.Client) (int, error) {
	ids := make([]uint64, len(clients))
	var leader uint64
	for i, cli := range clients {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, cli.Endpoints()[0])
		cancel()
		if err != nil {
			return 0, fmt.Errorf("%s status: %w", ec.nodes[i].id, err)
		}
		switch {
		case st.Leader == 0:
			return 0, fmt.Errorf("%s knows no leader", ec.nodes[i].id)
		case leader == 0:
			leader = st.Leader
		case st.Leader != leader:
			return 0, fmt.Errorf("%s reports leader %x, another member %x", ec.nodes[i].id, st.Leader, leader)
		}
		ids[i] = st.Header.GetMemberId()
	}
	for i, id := range ids {
		if id == leader {
			return i, nil
		}
	}
	return 0, fmt.Errorf("leader %x is not one of the members", leader)
}

// compareFigure is policyd against etcd for one writer count, from the same
// run.
type compareFigure struct {
	Scenario          string  `json:"scenario"`
	Writers           int     `json:"writers"`
	ValueSize         int     `json:"value_size"`
	PolicydWritesPerS float64 `json:"policyd_writes_per_s"`
	EtcdWritesPerS    float64 `json:"etcd_writes_per_s"`
	ThroughputRatio   float64 `json:"throughput_ratio"` // policyd ÷ etcd
	PolicydP50Ms      float64 `json:"policyd_p50_ms"`
	EtcdP50Ms         float64 `json:"etcd_p50_ms"`
	P50Ratio          float64 `json:"p50_ratio"` // policyd ÷ etcd; below 1 is faster
	PolicydP99Ms      float64 `json:"policyd_p99_ms"`
	EtcdP99Ms         float64 `json:"etcd_p99_ms"`
	// CPU time of the three members per acknowledged write.
	PolicydCPUMsPerWrite float64 `json:"policyd_cpu_ms_per_write,omitempty"`
	EtcdCPUMsPerWrite    float64 `json:"etcd_cpu_ms_per_write,omitempty"`
	Target               string  `json:"target"`
	TargetMet            bool    `json:"target_met"`
}

// compareWrites pairs the policyd and etcd figures by writer count. The run
// with many writers is held to the throughput target, the 1-writer run to
// the latency one.
func compareWrites(pd, ed []*writesFigure, manyWriters int) []*compareFigure {
	var out []*compareFigure
	for _, p := range pd {
		for _, e := range ed {
			if p.Writers != e.Writers {
				continue
			}
			f := &compareFigure{
				Scenario: "policyd-vs-etcd", Writers: p.Writers, ValueSize: p.ValueSize,
				PolicydWritesPerS: p.WritesPerS, EtcdWritesPerS: e.WritesPerS,
				ThroughputRatio: ratio(p.WritesPerS, e.WritesPerS),
				PolicydP50Ms:    p.P50Ms, EtcdP50Ms: e.P50Ms, P50Ratio: ratio(p.P50Ms, e.P50Ms),
				PolicydP99Ms: p.P99Ms, EtcdP99Ms: e.P99Ms,
				PolicydCPUMsPerWrite: p.NodesCPUMsPerWrite, EtcdCPUMsPerWrite: e.NodesCPUMsPerWrite,
			}
			clean := p.Errors == 0 && p.Writes > 0 && e.Writes > 0
			if p.Writers == 1 && manyWriters != 1 {
				f.Target = "1 writer: p50 ≤ etcd p50"
				f.TargetMet = clean && p.P50Ms <= e.P50Ms
			} else {
				f.Target = fmt.Sprintf("≥ %g × etcd writes/s, p99 ≤ %v", targetThroughputRatio, targetWritesP99)
				f.TargetMet = clean && f.ThroughputRatio >= targetThroughputRatio && p.P99Ms <= ms(targetWritesP99)
			}
			out = append(out, f)
		}
	}
	return out
}

// ratio is a ÷ b to two decimals, 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round2(a / b)
}

func (f *compareFigure) columns() []string {
	return []string{"scenario", "writers", "policyd w/s", "etcd w/s", "ratio", "policyd p50", "etcd p50",
		"p50 ratio", "policyd p99", "etcd p99", "cpu ms/write policyd/etcd", "target", "met"}
}

func (f *compareFigure) row() []string {
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{f.Scenario, strconv.Itoa(f.Writers), num(f.PolicydWritesPerS), num(f.EtcdWritesPerS),
		num(f.ThroughputRatio), num(f.PolicydP50Ms), num(f.EtcdP50Ms), num(f.P50Ratio),
		num(f.PolicydP99Ms), num(f.EtcdP99Ms), num(f.PolicydCPUMsPerWrite) + "/" + num(f.EtcdCPUMsPerWrite),
		f.Target, yesNo(f.TargetMet)}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
