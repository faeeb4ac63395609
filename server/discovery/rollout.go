package discovery

import (
	"cmp"
	"slices"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// Rollout is GET /v1/rollout: per version being rolled out, which
// discovery clients have ACKed it, NACKed it (a NACK counts as an answer:
// a sidecar that rejects a set must not hold the rollout up forever) or not
// answered yet.
type Rollout struct {
	// Done: every connected discovery client has answered the newest
	// version sent to it.
	Done     bool             `json:"done"`
	Versions []VersionRollout `json:"versions"`
	// Unreachable lists nodes whose clients are missing from this view.
	Unreachable []string `json:"unreachable_nodes,omitempty"`
}

// VersionRollout is one policy-set version's progress.
type VersionRollout struct {
	Version string      `json:"version"`
	Done    bool        `json:"done"`
	Acked   []ClientRef `json:"acked"`
	Nacked  []NackRef   `json:"nacked"`
	Pending []ClientRef `json:"pending"`
}

// ClientRef names one sidecar stream.
type ClientRef struct {
	Node   string `json:"node"`
	Client string `json:"client"`
	Scope  string `json:"scope"`
}

// NackRef is a client that rejected a version, with its error and the
// version it kept.
type NackRef struct {
	ClientRef
	Message         string `json:"message"`
	LastGoodVersion string `json:"last_good_version"`
}

// ComputeRollout groups discovery clients (from every node) by the newest
// version sent to them. WebSocket clients are left out: the feed has no
// acknowledgements.
func ComputeRollout(clients []*clusterv1.ClientInfo) Rollout {
	byVersion := map[string]*VersionRollout{}
	out := Rollout{Done: true, Versions: []VersionRollout{}}
	for _, c := range clients {
		if c.GetTransport() != "grpc" || c.GetVersionSent() == "" {
			continue
		}
		v := byVersion[c.GetVersionSent()]
		if v == nil {
			v = &VersionRollout{Version: c.GetVersionSent(), Acked: []ClientRef{}, Nacked: []NackRef{}, Pending: []ClientRef{}}
			byVersion[c.GetVersionSent()] = v
		}
		ref := ClientRef{Node: c.GetNodeId(), Client: c.GetClientAddress(), Scope: c.GetOrg() + "/" + c.GetTeam() + "/" + c.GetEmployee()}
		switch c.GetState() {
		case stateAcked:
			v.Acked = append(v.Acked, ref)
		case stateNacked:
			v.Nacked = append(v.Nacked, NackRef{ClientRef: ref, Message: c.GetNackMessage(), LastGoodVersion: c.GetNackVersion()})
		default:
			v.Pending = append(v.Pending, ref)
		}
	}
	refOrder := func(a, b ClientRef) int { return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Client, b.Client)) }
	for _, v := range byVersion {
		v.Done = len(v.Pending) == 0
		out.Done = out.Done && v.Done
		slices.SortFunc(v.Acked, refOrder)
		slices.SortFunc(v.Pending, refOrder)
		slices.SortFunc(v.Nacked, func(a, b NackRef) int { return refOrder(a.ClientRef, b.ClientRef) })
		out.Versions = append(out.Versions, *v)
	}
	slices.SortFunc(out.Versions, func(a, b VersionRollout) int { return cmp.Compare(a.Version, b.Version) })
	return out
}
