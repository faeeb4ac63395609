package raftfsm

import (
	"fmt"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// prepareSyncSource applies a source's sync whole: a conflict (a policy the
// source does not own, or one a rollout stages) refuses every part of the
// entry, and the leader's reconciler plans again.
func prepareSyncSource(m store.Meta, c *commandv1.SyncSource) (func(*store.Batch) *commandv1.Result, error) {
	if err := command.CheckSync(c); err != nil {
		return nil, err
	}
	puts := make([]*policy.Policy, len(c.GetPuts()))
	for i, pb := range c.GetPuts() {
		if !specObject(pb.GetSpec()) {
			return nil, fmt.Errorf("sync %s: puts[%d].spec is not a JSON object", c.GetSource(), i)
		}
		puts[i] = command.PolicyOf(pb)
	}
	adopt := make(map[string]bool, len(c.GetAdopt()))
	for _, name := range c.GetAdopt() {
		adopt[name] = true
	}
	s := store.SourceSync{
		Source: c.GetSource(), Revision: c.GetRevision(), Puts: puts, Deletes: c.GetDeletes(),
		Adopt: adopt, Last: c.GetPart()+1 == c.GetParts(), Request: c.GetRequest(),
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.SyncSource(m, s, func(name string) error { return underRollout(b, name) }))
	}, nil
}

func prepareRequestSourceSync(m store.Meta, c *commandv1.RequestSourceSync) (func(*store.Batch) *commandv1.Result, error) {
	if err := command.CheckSourceName(c.GetSource()); err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.RequestSourceSync(m, c.GetSource(), c.GetAllowPrune()))
	}, nil
}
