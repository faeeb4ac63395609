package raftfsm

import (
	"time"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

func prepareObserveDrift(m store.Meta, c *commandv1.ObserveDrift) (func(*store.Batch) *commandv1.Result, error) {
	obs, err := command.Observations(c)
	if err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.ObserveDrift(m, obs))
	}, nil
}

func prepareRecordDriftDelivery(m store.Meta, c *commandv1.RecordDriftDelivery) (func(*store.Batch) *commandv1.Result, error) {
	ds, err := command.Deliveries(c)
	if err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.RecordDriftDelivery(m, c.GetReportId(), ds, c.GetFinal()))
	}, nil
}

func prepareCompleteDriftTasks(m store.Meta, c *commandv1.CompleteDriftTasks) (func(*store.Batch) *commandv1.Result, error) {
	keys, err := command.TaskKeys(c)
	if err != nil {
		return nil, err
	}
	return func(b *store.Batch) *commandv1.Result {
		return result(m.Index, m.Index, b.CompleteDriftTasks(m, keys))
	}, nil
}

func preparePruneDrift(m store.Meta, c *commandv1.PruneDrift) (func(*store.Batch) *commandv1.Result, error) {
	cutoff := time.Unix(0, c.GetCutoffUnixNano())
	return func(b *store.Batch) *commandv1.Result {
		n, err := b.PruneDrift(cutoff)
		// Revision carries the count, as for PruneEvents.
		return result(m.Index, uint64(n), err)
	}, nil
}
