package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
)

// Ends of a send that the shipper treats apart from a failure to deliver.
var (
	// errShipUnsupported: the node does not take decision logs (an older
	// build); the shipper stops for the connection and records stay
	// buffered.
	errShipUnsupported = errors.New("the node does not take decision logs")
	// errShipInvalid: the node refused the batch as invalid, which it
	// would do again; its records are counted refused and not sent again,
	// so that one bad batch cannot hold up every record after it.
	errShipInvalid = errors.New("the node refused the batch as invalid")
)

// shipBatchBytes caps the records of one batch a little under
// decisionsv1.MaxBatchBytes, leaving room for the framing, so that a full
// batch's message also fits a gRPC server's default 4 MiB receive limit.
const shipBatchBytes = decisionsv1.MaxBatchBytes - 64<<10

// shipResult is a node's answer to a batch.
type shipResult struct{ accepted, refused uint64 }

// shipFunc delivers one batch: records (JSON objects, at most the caps of
// decisionsv1) and the drop counts since the last batch the node took.
type shipFunc func(ctx context.Context, records [][]byte, drops decisionsv1.Drops) (shipResult, error)

// takeBatch takes the oldest records that fit one batch, with the drop
// counts grown since the last report. A record over MaxRecordBytes, which
// no node takes, is dropped and counted buffer_full. more reports that
// records are left.
func (d *decisionLog) takeBatch() (batch [][]byte, drops decisionsv1.Drops, more bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for d.head < len(d.buf) && len(batch) < decisionsv1.MaxBatchRecords {
		b := d.buf[d.head]
		if len(b) > decisionsv1.MaxRecordBytes {
			d.buf[d.head] = nil
			d.head++
			d.bytes -= len(b)
			d.bufferFull++
			continue
		}
		if n+len(b) > shipBatchBytes {
			break
		}
		batch = append(batch, b)
		n += len(b)
		d.buf[d.head] = nil
		d.head++
	}
	more = d.head < len(d.buf)
	if !more {
		d.buf, d.head = d.buf[:0], 0
	}
	d.bytes -= n
	d.taken += uint64(len(batch))
	return batch, d.dropsLocked(), more
}

// dropsLocked is the drop counts grown since the last report (d.mu held).
func (d *decisionLog) dropsLocked() decisionsv1.Drops {
	return decisionsv1.Drops{
		SampledOut:  d.sampledOut.Load() - d.reported.SampledOut,
		BufferFull:  d.bufferFull - d.reported.BufferFull,
		RateLimited: d.rateLimited.Load() - d.reported.RateLimited,
		MaskFailed:  d.maskFailed.Load() - d.reported.MaskFailed,
	}
}

// peekSource is takeBatch for a DecisionLog.Source: the source's oldest
// records, which stay there until shipped.
func (d *decisionLog) peekSource() (batch [][]byte, drops decisionsv1.Drops, err error) {
	batch, err = d.source.Peek(decisionsv1.MaxBatchRecords, shipBatchBytes)
	if err != nil {
		return nil, decisionsv1.Drops{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return batch, d.dropsLocked(), nil
}

// dropsReported records that a node took drops.
func (d *decisionLog) dropsReported(drops decisionsv1.Drops) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reported.SampledOut += drops.SampledOut
	d.reported.BufferFull += drops.BufferFull
	d.reported.RateLimited += drops.RateLimited
	d.reported.MaskFailed += drops.MaskFailed
}

// shipLoop ships the decision log over one connection every flush
// interval, and as soon as a full batch is buffered, until ctx ends or the
// node turns out not to take decision logs. ready, when not nil, says
// whether the connection takes them now (the feed's init); until it does
// nothing is sent and records stay buffered. After a failed batch, a full
// buffer waits for the next tick rather than retry at once.
func (c *Client) shipLoop(ctx context.Context, ready func() bool, send shipFunc) {
	d := c.dlog
	t := time.NewTicker(d.flush)
	defer t.Stop()
	// kick is nil while a wake-up would be wasted (the last flush failed,
	// the connection does not take batches yet, or records ship from a
	// Source), so that a full buffer does not wake the loop per record.
	var kick <-chan struct{}
	if d.source == nil {
		kick = d.kick
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		if ready != nil && !ready() {
			kick = nil
			continue
		}
		err := c.flushDecisions(ctx, send)
		kick = nil
		if err == nil && d.source == nil {
			kick = d.kick
		}
		switch {
		case errors.Is(err, errShipUnsupported):
			c.logger.Warn("the node does not take decision logs: records stay buffered, within the cap, until a connection to a node that does", "err", err)
			return
		case err != nil && ctx.Err() == nil:
			c.logger.Debug("decision batch not delivered; its records are kept for the next try", "err", err)
		}
	}
}

// flushDecisions sends batches until the buffer is empty or one fails.
// A batch not delivered goes back to the buffer, and its drop counts go
// with the next.
func (c *Client) flushDecisions(ctx context.Context, send shipFunc) error {
	d := c.dlog
	for ctx.Err() == nil {
		var batch [][]byte
		var drops decisionsv1.Drops
		var more bool
		if d.source != nil {
			var err error
			if batch, drops, err = d.peekSource(); err != nil {
				return fmt.Errorf("decision source: %w", err)
			}
			more = len(batch) > 0
		} else {
			batch, drops, more = d.takeBatch()
		}
		if len(batch) == 0 && drops == (decisionsv1.Drops{}) {
			return nil
		}
		sctx, cancel := context.WithTimeout(ctx, maxHealthTimeout)
		res, err := send(sctx, batch, drops)
		cancel()
		switch {
		case errors.Is(err, errShipInvalid):
			d.refused.Add(uint64(len(batch)))
			return errors.Join(err, d.sourceShipped(len(batch)))
		case err != nil:
			if d.source == nil {
				c.ReturnDecisions(batch)
			}
			d.shipFailures.Add(1)
			return err
		}
		d.shipped.Add(res.accepted)
		d.refused.Add(res.refused)
		d.dropsReported(drops)
		if err := d.sourceShipped(len(batch)); err != nil {
			return err
		}
		if !more {
			return nil
		}
	}
	return ctx.Err()
}

// sourceShipped tells the source, if there is one, that n records are
// done with.
func (d *decisionLog) sourceShipped(n int) error {
	if d.source == nil || n == 0 {
		return nil
	}
	if err := d.source.Shipped(n); err != nil {
		return fmt.Errorf("decision source: %w", err)
	}
	return nil
}
