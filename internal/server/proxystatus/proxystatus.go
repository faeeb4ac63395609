// Package proxystatus holds the rollout view of discovery clients
// (docs/sidecars.md): the states a stream reports for its newest version, and how
// GET /v1/rollout groups clients by version. The discovery server writes
// the states and the admin API reads them, so they live apart from both.
package proxystatus

import (
	"cmp"
	"slices"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// States of a client's newest version, as ClientInfo.State carries them.
const (
	Pending = "pending"
	Acked   = "acked"
	Nacked  = "nacked"
)

// Status is GET /v1/rollout: per version being rolled out, which
// discovery clients have ACKed it, NACKed it (a NACK counts as an answer:
// a sidecar that rejects a set must not hold the rollout up forever) or not
// answered yet.
type Status struct {
	// Done: every connected discovery client has answered the newest
	// version sent to it.
	Done     bool      `json:"done"`
	Versions []Version `json:"versions"`
	// Unreachable lists nodes whose clients are missing from this view.
	Unreachable []string `json:"unreachable_nodes,omitempty"`
}

// Version is one policy-set version's progress.
type Version struct {
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

// Compute groups discovery clients (from every node) by the newest
// version sent to them. WebSocket clients are left out: the feed has no
// acknowledgements.
func Compute(clients []*clusterv1.ClientInfo) Status {
	byVersion := map[string]*Version{}
	out := Status{Done: true, Versions: []Version{}}
	for _, c := range clients {
		if c.GetTransport() != "grpc" || c.GetVersionSent() == "" {
			continue
		}
		v := byVersion[c.GetVersionSent()]
		if v == nil {
			v = &Version{Version: c.GetVersionSent(), Acked: []ClientRef{}, Nacked: []NackRef{}, Pending: []ClientRef{}}
			byVersion[c.GetVersionSent()] = v
		}
		ref := ClientRef{Node: c.GetNodeId(), Client: c.GetClientAddress(), Scope: c.GetOrg() + "/" + c.GetTeam() + "/" + c.GetEmployee()}
		switch c.GetState() {
		case Acked:
			v.Acked = append(v.Acked, ref)
		case Nacked:
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
	slices.SortFunc(out.Versions, func(a, b Version) int { return cmp.Compare(a.Version, b.Version) })
	return out
}
