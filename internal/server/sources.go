package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/sources"
	"github.com/policyd/policyd/internal/store"
)

// hookVerifier is a driver that takes webhooks (Git).
type hookVerifier interface {
	VerifyHook(h http.Header, body []byte) error
}

// setupSources builds the policy sources' engine and registers it as a
// leader task; nil without sources. Nothing reads a source until this node
// leads.
func (n *Node) setupSources() error {
	drivers, err := n.sourceDrivers()
	if err != nil || len(drivers) == 0 {
		return err
	}
	m, err := sources.NewMetrics(n.reg)
	if err != nil {
		return fmt.Errorf("source metrics: %w", err)
	}
	cfg := n.cfg.Sources
	e, err := sources.New(sources.Config{Debounce: cfg.Debounce, MaxPruneRatio: cfg.MaxPruneRatio},
		n.logger.With("component", "sources"),
		sources.Deps{Store: n.store, Validator: n.validator, Propose: n.ProposeLocal, Metrics: m},
		drivers...)
	if err != nil {
		return err
	}
	n.sources = e
	n.AddLeaderTask(raftnode.LeaderTask{Name: "sources", Run: e.Run})
	return nil
}

// SourceNames lists the configured sources.
func (n *Node) SourceNames() []string {
	if n.sources == nil {
		return nil
	}
	return n.sources.Names()
}

// SourceStatus is this node's reconciler status of a configured source.
func (n *Node) SourceStatus(name string) (sources.Status, bool) {
	if n.sources == nil {
		return sources.Status{}, false
	}
	return n.sources.Status(name)
}

// VerifySourceHook checks a webhook for a configured Git source; the sync
// request it leads to goes through the log to the leader.
func (n *Node) VerifySourceHook(name string, h http.Header, body []byte) error {
	if n.sources == nil {
		return sources.ErrNotConfigured
	}
	d, ok := n.sources.Driver(name).(hookVerifier)
	if !ok {
		return sources.ErrNotConfigured
	}
	return d.VerifyHook(h, body)
}

// LeaderHTTPAddr is the leader's admin address, "" while unknown.
func (n *Node) LeaderHTTPAddr() string {
	id := n.LeaderID()
	if id == "" {
		return ""
	}
	m, err := n.store.Member(id)
	if err != nil {
		return ""
	}
	return m.HTTPAddr
}

// fleet is what the Kubernetes source's status needs of the node: how far
// a policy has reached the connected sidecars, cluster-wide.
type fleet struct {
	n *Node
	// The driver asks about many objects at once (1,000 applied together):
	// they share one cluster-wide gather of the clients for clientsTTL.
	mu      sync.Mutex
	at      time.Time
	clients []*clusterv1.ClientInfo
}

// clientsTTL is how long one gather of the connected sidecars answers for.
const clientsTTL = 250 * time.Millisecond

func newFleet(n *Node) *fleet { return &fleet{n: n} }

// gather returns the cluster's connected sidecars, at most clientsTTL old.
func (f *fleet) gather(ctx context.Context) ([]*clusterv1.ClientInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.clients != nil && time.Since(f.at) < clientsTTL {
		return f.clients, nil
	}
	clients, _, err := f.n.Clients(ctx)
	if err != nil {
		return nil, err
	}
	f.clients, f.at = clients, time.Now()
	return clients, nil
}

// Reach counts the sidecars the named policy applies to by their answer
// to the set this node computes for them now: a sidecar that ACKed it holds
// the policy's current revision. One that ACKed an older set counts as
// pending, even when what changed since was another policy of its scope.
func (f *fleet) Reach(ctx context.Context, name string) (sources.Sidecars, error) {
	var s sources.Sidecars
	rp, ok := f.n.policies.Get(name)
	if !ok {
		// The index takes in a commit just after the store: counting now
		// would find no sidecar, and 0/0 would read as rolled out.
		return s, fmt.Errorf("policy %s is not in this node's policy index yet", name)
	}
	clients, err := f.gather(ctx)
	if err != nil {
		return s, err
	}
	for _, c := range clients {
		id := policy.Identity{Org: c.GetOrg(), Team: c.GetTeam(), Employee: c.GetEmployee()}
		if !rp.Policy.Scope.AppliesTo(id) {
			continue
		}
		s.Total++
		set := f.n.policies.Set(id)
		current := func(v string) bool { return v != "" && (v == set.Version || v == set.WithoutShadow().Version) }
		switch {
		case current(c.GetVersionAcked()):
			s.Acked++
		case c.GetState() == "nacked" && current(c.GetVersionSent()):
			s.Nacked++
			if s.FirstNack == "" {
				s.FirstNack = c.GetNackMessage()
			}
		default:
			s.Pending++
		}
	}
	return s, nil
}

// Staging names the stage of a running rollout of the named policy, "" if
// none.
func (f *fleet) Staging(name string) string {
	rs, err := f.n.store.ActiveRollouts()
	if err != nil {
		return ""
	}
	for _, r := range rs {
		for _, c := range r.GetChanges() {
			if store.ChangeName(c) == name && r.GetState() == store.RolloutRunning {
				return fmt.Sprintf("%s stage %d of %d", r.GetId(), r.GetStage()+1, len(r.GetStages()))
			}
		}
	}
	return ""
}

var _ sources.Fleet = (*fleet)(nil)
