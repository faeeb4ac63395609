package feed

import (
	"encoding/json"
	"fmt"
	"time"

	feedv1 "github.com/policyd/policyd/api/feed/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/policyset"
	"github.com/policyd/policyd/internal/store"
)

// outMsg is one encoded message queued for a connection.
type outMsg struct {
	data []byte
	// digest is the set version the client holds once it has applied the
	// message; "" leaves the last one (Clients' version_sent) unchanged.
	digest string
	// at is the commit time of the change the message carries (zero for
	// messages no change caused), for policy_broadcast_latency_ms.
	at time.Time
	// policy marks init, upsert and delete, for policy_broadcast_count.
	policy bool
}

// msgKey identifies an encoded upsert or delete within a batch. The digest
// is part of it: two identities that get the same change generally hold
// different sets.
type msgKey struct {
	typ     string
	name    string
	version uint64
	digest  string
}

// batch carries the per-batch cache of OnChange: each distinct message
// encoded once and shared by every connection that gets it.
type batch struct {
	h       *Hub
	index   uint64
	at      time.Time
	encoded map[msgKey][]byte
}

func newBatch(h *Hub, c store.Change) *batch {
	return &batch{h: h, index: c.Index, at: c.At, encoded: map[msgKey][]byte{}}
}

// policyMessage is the message that brings a connection to set for policy
// name, changed at index: upsert of the set's policy if the set holds it,
// delete otherwise. The set decides rather than the policy's scope, so that
// a rollout's cohort is sent the candidate and everyone else the stable
// policy; the digest, a hash of the set's content, keys the cache.
func (b *batch) policyMessage(set *policyset.Set, name string, index uint64) (outMsg, error) {
	digest := set.Version
	rp, applies := set.Lookup(name)
	key := msgKey{typ: feedv1.TypeDelete, name: name, version: index, digest: digest}
	if applies {
		key.typ = feedv1.TypeUpsert
	}
	data, ok := b.encoded[key]
	if !ok {
		var err error
		if applies {
			data, err = encode(feedv1.Upsert{Type: feedv1.TypeUpsert, Policy: *wirePolicy(rp.Policy), Version: index, Digest: digest})
		} else {
			data, err = encode(feedv1.Delete{Type: feedv1.TypeDelete, PolicyName: name, Version: index, Digest: digest})
		}
		if err != nil {
			return outMsg{}, err
		}
		b.encoded[key] = data
	}
	return outMsg{data: data, digest: digest, at: b.at, policy: true}, nil
}

// wirePolicy converts a stored policy to its wire form.
func wirePolicy(p *policy.Policy) *feedv1.Policy {
	return &feedv1.Policy{
		Name:     p.Name,
		Kind:     p.Kind,
		Scope:    feedv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
		Labels:   p.Labels,
		Spec:     p.Spec,
		Revision: p.Revision,
		// Only connections that declared "shadow" are served a set
		// holding shadow policies (policyset.Set.WithoutShadow).
		Enforcement: p.Enforcement,
	}
}

func wireScope(s feedv1.Scope) policy.Scope {
	return policy.Scope{Org: s.Org, Team: s.Team, Employee: s.Employee}
}

// encodeInit encodes the init message of a set; decisions invites
// decision_log messages.
func encodeInit(set *policyset.Set, decisions bool) ([]byte, error) {
	m := feedv1.Init{
		Type:        feedv1.TypeInit,
		Policies:    make([]feedv1.Policy, 0, len(set.Policies)),
		Version:     set.Index,
		Digest:      set.Version,
		DecisionLog: decisions,
	}
	for _, rp := range set.Policies {
		m.Policies = append(m.Policies, *wirePolicy(rp.Policy))
	}
	return encode(m)
}

// encode marshals one message. It only fails on a policy whose stored
// spec is not valid JSON, which the write path never stores.
func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode feed message: %w", err)
	}
	return b, nil
}

// pingMessage is the one ping, encoded once.
var pingMessage = mustEncode(feedv1.Ping{Type: feedv1.TypePing})

func mustEncode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // a constant message; caught by every test
	}
	return b
}
