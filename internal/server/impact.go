package server

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/impact"
	"github.com/policyd/policyd/internal/server/members"
)

// impactAnswerMargin is kept from a replay's deadline for its answer to
// travel back before the asker stops waiting.
const impactAnswerMargin = 500 * time.Millisecond

// localImpact is this node's part of an impact replay: the decisions it
// keeps, decided again under its replica's policies with and without the
// changes, until shortly before ctx's deadline.
func (n *Node) localImpact(ctx context.Context, req *clusterv1.LocalImpactRequest) (*clusterv1.LocalImpactResponse, error) {
	if n.decisions == nil {
		return &clusterv1.LocalImpactResponse{NodeId: n.id}, nil
	}
	im, err := n.policies.Impact(req.GetChanges())
	if err != nil {
		return nil, fmt.Errorf("impact: %w", err)
	}
	opts := impact.OptionsFrom(n.id, req)
	if dl, ok := ctx.Deadline(); ok {
		opts.Deadline = dl.Add(-impactAnswerMargin)
	}
	// Replay watches ctx itself and answers what it counted when it ends.
	scan := func(yield func([]byte) bool) error {
		return n.decisions.Scan(context.Background(), opts.Since, yield)
	}
	return impact.Replay(ctx, opts, scan, im.Sets)
}

// Impact is POST /v1/impact: every member replays its own decision log
// until deadline, and the answers are summed per org and team. A member
// that does not answer is named in Unavailable, one whose replay ran out
// of time in CutOff.
func (n *Node) Impact(ctx context.Context, req *clusterv1.LocalImpactRequest, deadline time.Time, maskIdentities bool) (*decisionsv1.ImpactReport, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	applied := n.store.AppliedIndex()
	local, err := n.localImpact(ctx, req)
	if err != nil {
		return nil, err
	}
	answers, unavailable, err := members.Gather(ctx, n.consensus, "replay its decisions", []*clusterv1.LocalImpactResponse{local},
		func(ctx context.Context, c clusterv1.ClusterClient) ([]*clusterv1.LocalImpactResponse, error) {
			resp, err := c.LocalImpact(ctx, req)
			return []*clusterv1.LocalImpactResponse{resp}, err
		})
	if err != nil {
		return nil, err
	}
	maxExamples := int(req.GetMaxExamples())
	if maxExamples == 0 {
		maxExamples = impact.DefaultMaxExamples
	}
	rep := mergeImpact(answers, maxExamples, func(b []byte) (decisionsv1.Record, bool) {
		var r decisionsv1.Record
		if json.Unmarshal(b, &r) != nil {
			return r, false
		}
		if maskIdentities {
			n.masker.Mask(&r)
		}
		return r, true
	})
	rep.Since = time.Unix(0, req.GetSinceUnixNano()).UTC()
	rep.AppliedIndex = applied
	rep.Unavailable = unavailable
	return rep, nil
}

// mergeImpact sums the members' answers; example decodes (and masks) an
// example record.
func mergeImpact(answers []*clusterv1.LocalImpactResponse, maxExamples int, example func([]byte) (decisionsv1.Record, bool)) *decisionsv1.ImpactReport {
	rep := &decisionsv1.ImpactReport{Teams: []decisionsv1.ImpactTeam{}}
	type key struct{ org, team string }
	teams := map[key]*decisionsv1.ImpactTeam{}
	addExamples := func(dst *[]decisionsv1.Record, src [][]byte) {
		for _, b := range src {
			if len(*dst) >= maxExamples {
				return
			}
			if r, ok := example(b); ok {
				*dst = append(*dst, r)
			}
		}
	}
	var oldest int64
	for _, a := range answers {
		rep.Scanned += a.GetScanned()
		rep.Masked += a.GetMasked()
		rep.Unrecorded += a.GetUnrecorded()
		if a.GetCutOff() {
			rep.CutOff = append(rep.CutOff, a.GetNodeId())
		}
		if o := a.GetOldestUnixNano(); o > 0 && (oldest == 0 || o < oldest) {
			oldest = o
		}
		for _, c := range a.GetTeams() {
			k := key{c.GetOrg(), c.GetTeam()}
			t := teams[k]
			if t == nil {
				t = &decisionsv1.ImpactTeam{Org: k.org, Team: k.team}
				teams[k] = t
			}
			t.Evaluated += c.GetEvaluated()
			t.AllowToDeny += c.GetAllowToDeny()
			t.DenyToAllow += c.GetDenyToAllow()
			t.Unchanged += c.GetUnchanged()
			t.Errors += c.GetErrors()
			addExamples(&t.AllowToDenyExamples, c.GetAllowToDenyExamples())
			addExamples(&t.DenyToAllowExamples, c.GetDenyToAllowExamples())
		}
	}
	for _, t := range teams {
		rep.Teams = append(rep.Teams, *t)
		rep.Totals.Evaluated += t.Evaluated
		rep.Totals.AllowToDeny += t.AllowToDeny
		rep.Totals.DenyToAllow += t.DenyToAllow
		rep.Totals.Unchanged += t.Unchanged
		rep.Totals.Errors += t.Errors
	}
	slices.SortFunc(rep.Teams, func(a, b decisionsv1.ImpactTeam) int {
		return cmp.Or(cmp.Compare(a.Org, b.Org), cmp.Compare(a.Team, b.Team))
	})
	slices.Sort(rep.CutOff)
	if rep.Totals.Evaluated > 0 {
		rep.AllowToDenyRatio = float64(rep.Totals.AllowToDeny) / float64(rep.Totals.Evaluated)
	}
	if oldest > 0 {
		t := time.Unix(0, oldest).UTC()
		rep.Oldest = &t
	}
	return rep
}
