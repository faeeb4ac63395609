package server

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
	"github.com/policyd/policyd/internal/server/decisionlog"
	"github.com/policyd/policyd/internal/server/members"
)

// setupDecisions opens the node's decision log under data_dir/decisions,
// unless decisions.enabled is false.
func (n *Node) setupDecisions() error {
	d := n.cfg.Decisions
	if !d.Enabled {
		return nil
	}
	l, err := decisionlog.New(decisionlog.Config{
		Dir: filepath.Join(n.cfg.DataDir, "decisions"), Retention: d.Retention, MaxBytes: d.MaxBytes,
		ExportFile: d.ExportFile, ExportMaxBytes: d.ExportMaxBytes, MaxRecordsPerSecond: d.MaxRecordsPerSecond,
	}, n.logger.With("component", "decisions"), n.id, n.reg)
	if err != nil {
		return err
	}
	n.decisions, n.masker = l, decisionlog.NewMasker()
	return nil
}

// localDecisions answers a member's LocalDecisions, or with nothing when
// this node keeps no decisions.
func (n *Node) localDecisions(ctx context.Context, req *clusterv1.LocalDecisionsRequest) (*clusterv1.LocalDecisionsResponse, error) {
	if n.decisions == nil {
		return &clusterv1.LocalDecisionsResponse{NodeId: n.id}, nil
	}
	return n.decisions.LocalDecisions(ctx, req)
}

// Decisions is GET /v1/decisions: every member's newest matching records,
// merged by time, newest first. A member that does not answer in time is
// named in Unavailable and the page is served without its records.
// maskIdentities hides employees and client addresses (a read token's view
// under decisions.mask_identities).
func (n *Node) Decisions(ctx context.Context, req *clusterv1.LocalDecisionsRequest, maskIdentities bool) (*decisionsv1.Page, error) {
	local, err := n.localDecisions(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("read this node's decisions: %w", err)
	}
	answers, unavailable, err := members.Gather(ctx, n.consensus, "report its decisions", []*clusterv1.LocalDecisionsResponse{local},
		func(ctx context.Context, c clusterv1.ClusterClient) ([]*clusterv1.LocalDecisionsResponse, error) {
			resp, err := c.LocalDecisions(ctx, req)
			return []*clusterv1.LocalDecisionsResponse{resp}, err
		})
	if err != nil {
		return nil, err
	}
	limit := int(req.GetLimit())
	if limit <= 0 {
		limit = decisionlog.DefaultLimit
	}
	recs, next := decisionlog.Merge(min(limit, decisionlog.MaxLimit), answers)
	page := &decisionsv1.Page{Records: make([]decisionsv1.Record, 0, len(recs)), Unavailable: unavailable}
	for _, d := range recs {
		var r decisionsv1.Record
		if err := json.Unmarshal(d, &r); err != nil {
			continue // every node stores what it re-encoded itself
		}
		if maskIdentities {
			n.masker.Mask(&r)
		}
		page.Records = append(page.Records, r)
	}
	if next != nil {
		page.Cursor = decisionlog.EncodeCursor(next)
	}
	slices.Sort(page.Unavailable)
	return page, nil
}

// DecisionsMasked reports whether read tokens see identities masked.
func (n *Node) DecisionsMasked() bool { return n.cfg.Decisions.MaskIdentities }
