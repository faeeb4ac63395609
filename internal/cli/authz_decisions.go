package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/decisions"
)

// Defaults and bounds of the authz decision-log flags.
const (
	defaultDecisionAllowRate   = client.DefaultAllowSampleRate
	defaultDecisionDirMaxBytes = 64 << 20
	// minDecisionDirMaxBytes keeps the ring at eight segments of at least
	// 128 KiB, so that one batch never fills it.
	minDecisionDirMaxBytes = 1 << 20
	// spillInterval is how often the SDK's buffer goes to disk: what a
	// kill -9 can lose.
	spillInterval = client.DefaultDecisionFlushInterval
	// maxSpillTakeBytes bounds one take from the SDK's buffer, well within
	// one Append (decisions.MaxBatchBytes, framing included); a take is
	// also at most a segment, so that the ring stays near its size.
	maxSpillTakeBytes = 4 << 20
)

// decisionLogFlags are authz's --decision-log* flags.
type decisionLogFlags struct {
	on        bool
	allowRate float64
	dir       string
	maxBytes  int64
}

func (df *decisionLogFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&df.on, "decision-log", false, "record decisions (every denial and a share of allows, masked) and ship them to the node")
	f.Float64Var(&df.allowRate, "decision-log-allow-rate", defaultDecisionAllowRate, "share of allowed decisions recorded, in [0, 1]")
	f.StringVar(&df.dir, "decision-log-dir", "", "directory of a disk ring the records go through before shipping, fsynced every second, so that a crash loses at most the last second")
	f.Int64Var(&df.maxBytes, "decision-log-dir-max-bytes", defaultDecisionDirMaxBytes, "size of the disk ring; when full, its oldest records go, shipped or not")
}

// config is the SDK's DecisionLog the flags describe (nil: off), with the
// disk ring when --decision-log-dir is set; the caller closes the ring.
func (df *decisionLogFlags) config(f *pflag.FlagSet, logger *slog.Logger) (*client.DecisionLog, *decisionSpool, error) {
	if !df.on {
		for _, name := range []string{"decision-log-allow-rate", "decision-log-dir", "decision-log-dir-max-bytes"} {
			if f.Changed(name) {
				return nil, nil, &usageError{fmt.Errorf("--%s needs --decision-log", name)}
			}
		}
		return nil, nil, nil
	}
	if !(df.allowRate >= 0 && df.allowRate <= 1) {
		return nil, nil, &usageError{fmt.Errorf("--decision-log-allow-rate %v is not in [0, 1]", df.allowRate)}
	}
	rate := df.allowRate
	dl := &client.DecisionLog{AllowSampleRate: &rate}
	if df.dir == "" {
		if f.Changed("decision-log-dir-max-bytes") {
			return nil, nil, &usageError{errors.New("--decision-log-dir-max-bytes needs --decision-log-dir")}
		}
		return dl, nil, nil
	}
	if df.maxBytes < minDecisionDirMaxBytes {
		return nil, nil, &usageError{fmt.Errorf("--decision-log-dir-max-bytes %d is below %d", df.maxBytes, minDecisionDirMaxBytes)}
	}
	sp, err := openSpool(df.dir, df.maxBytes, logger)
	if err != nil {
		return nil, nil, err
	}
	dl.Source = sp
	return dl, sp, nil
}

// decisionSpool is the disk ring of --decision-log-dir: every
// spillInterval the records in the SDK's buffer are appended to a
// decisions.Store under dir/ring and fsynced, and the SDK ships them from
// there (client.DecisionSource), oldest first. dir/shipped holds the
// cursor after the last record a node took, so that a restart ships the
// rest and not again what went.
type decisionSpool struct {
	store      *decisions.Store
	cursorPath string
	logger     *slog.Logger
	takeBytes  int

	// mu makes an Append and its fsync one step for Peek, which so only
	// ships records on disk.
	mu      sync.Mutex
	shipped decisions.Cursor
	// peeked is the cursor after each record of the last Peek.
	peeked []decisions.Cursor
	// oversize counts records over decisions.MaxRecordBytes, not spilled.
	oversize uint64
}

// openSpool opens (or creates) the ring in dir and reads its cursor.
func openSpool(dir string, maxBytes int64, logger *slog.Logger) (*decisionSpool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("decision log dir: %w", err)
	}
	st, err := decisions.Open(filepath.Join(dir, "ring"), decisions.Config{
		MaxBytes:     maxBytes,
		SegmentBytes: maxBytes / 8,
		// The spill fsyncs after each append itself.
		FlushInterval: -1,
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("decision log dir: %w", err)
	}
	sp := &decisionSpool{store: st, cursorPath: filepath.Join(dir, "shipped"), logger: logger,
		takeBytes: int(min(maxSpillTakeBytes, maxBytes/8))}
	b, err := os.ReadFile(sp.cursorPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		_ = st.Close()
		return nil, fmt.Errorf("decision log dir: %w", err)
	default:
		if sp.shipped, err = decisions.ParseCursor(strings.TrimSpace(string(b))); err != nil {
			logger.Warn("decision log: unreadable shipped cursor; shipping the ring from its oldest record", "file", sp.cursorPath, "err", err)
		}
	}
	return sp, nil
}

// spillLoop moves the SDK's buffer to disk every spillInterval until ctx
// ends, and once more then, so that a clean stop loses nothing.
func (sp *decisionSpool) spillLoop(ctx context.Context, c *client.Client) {
	t := time.NewTicker(spillInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			sp.spill(c)
			return
		case <-t.C:
			sp.spill(c)
		}
	}
}

// spill appends what the SDK's buffer holds to the ring and fsyncs it. A
// batch the ring cannot take goes back to the buffer for the next try.
func (sp *decisionSpool) spill(c *client.Client) {
	for {
		taken := c.TakeDecisions(sp.takeBytes)
		if len(taken) == 0 {
			return
		}
		now := time.Now()
		batch := make([]decisions.Record, 0, len(taken))
		for _, b := range taken {
			if len(b) > decisions.MaxRecordBytes {
				sp.oversize++
				sp.logger.Warn("decision log: a record over the size a node takes is not kept", "bytes", len(b))
				continue
			}
			batch = append(batch, decisions.Record{Time: now, Data: b})
		}
		if err := sp.append(batch); err != nil {
			c.ReturnDecisions(taken)
			sp.logger.Warn("decision log: could not write the disk ring; records stay in memory", "err", err)
			return
		}
	}
}

// append writes batch, in Append's caps, and fsyncs it.
func (sp *decisionSpool) append(batch []decisions.Record) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for len(batch) > 0 {
		n := min(len(batch), decisions.MaxBatchRecords)
		if err := sp.store.Append(batch[:n]); err != nil {
			return err
		}
		batch = batch[n:]
	}
	return sp.store.Sync()
}

// Peek returns the oldest records on disk not yet shipped.
func (sp *decisionSpool) Peek(maxRecords, maxBytes int) ([][]byte, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var out [][]byte
	sp.peeked = sp.peeked[:0]
	size := 0
	_, err := sp.store.ScanFrom(sp.shipped, time.Time{}, func(r decisions.Record, next decisions.Cursor) bool {
		if len(out) >= maxRecords || size+len(r.Data) > maxBytes {
			return false
		}
		out = append(out, bytes.Clone(r.Data))
		sp.peeked = append(sp.peeked, next)
		size += len(r.Data)
		return true
	})
	if errors.Is(err, decisions.ErrBadCursor) {
		// Damage on disk since the cursor was written: ship again from the
		// oldest record kept rather than lose what follows.
		sp.logger.Warn("decision log: the shipped cursor is no longer at a record; shipping the ring from its oldest record", "err", err)
		sp.shipped, sp.peeked = decisions.Cursor{}, sp.peeked[:0]
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Shipped moves the cursor past the first n records of the last Peek and
// writes it down.
func (sp *decisionSpool) Shipped(n int) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if n <= 0 {
		return nil
	}
	if n > len(sp.peeked) {
		return fmt.Errorf("shipped %d records of a peek of %d", n, len(sp.peeked))
	}
	sp.shipped = sp.peeked[n-1]
	sp.peeked = sp.peeked[:0]
	return writeFileAtomic(sp.cursorPath, []byte(sp.shipped.String()+"\n"))
}

// close closes the ring.
func (sp *decisionSpool) close() error { return sp.store.Close() }

// writeFileAtomic replaces path with b, durably: a crash leaves the old
// content or the new.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
