// Package decisionlog is a node's decision log (docs/decisions.md): it
// takes the batches its sidecars report, checks them against the identity
// the node authenticated, keeps them in the node's own store
// (internal/decisions, not replicated), mirrors them to an optional JSON
// lines export, and answers this node's part of GET /v1/decisions and of
// an impact replay. The listeners hand it batches; the node fans queries
// out over the peer plane.
package decisionlog

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/policyd/policyd/internal/decisions"
)

// Errors callers map to gRPC codes (discovery) or count (feed).
var (
	// ErrRateLimited: the sidecar reported more than its share; the batch
	// was not kept and the SDK sends it again.
	ErrRateLimited = errors.New("decision batch rate limited")
	// ErrTooLarge: a batch over decisionsv1's caps, refused whole.
	ErrTooLarge = errors.New("decision batch too large")
)

// Config is the node's decisions section (config.Decisions) and where its
// store lives.
type Config struct {
	Dir            string
	Retention      time.Duration
	MaxBytes       int64
	ExportFile     string
	ExportMaxBytes int64
	// MaxRecordsPerSecond is each sidecar's share, with a burst of two
	// seconds' worth (a batch a second plus one sent again).
	MaxRecordsPerSecond int
	// PruneInterval is how often retention runs; 0: a minute.
	PruneInterval time.Duration
}

// Log is one node's decision log. Safe for concurrent use.
type Log struct {
	cfg    Config
	logger *slog.Logger
	nodeID string
	store  *decisions.Store
	export *exporter
	now    func() time.Time

	mu       sync.Mutex
	limiters map[string]*limiter // per sidecar: transport and client address

	received *prometheus.CounterVec
	dropped  *prometheus.CounterVec

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// limiter is a sidecar's token bucket and when it was last used, so that
// the buckets of gone sidecars are swept.
type limiter struct {
	bucket *rate.Limiter
	used   time.Time
}

// New opens the store under cfg.Dir and starts retention; its metrics are
// registered with reg (nil: not registered).
func New(cfg Config, logger *slog.Logger, nodeID string, reg prometheus.Registerer) (*Log, error) {
	if cfg.MaxRecordsPerSecond <= 0 {
		return nil, fmt.Errorf("decision log: max records per second %d must be above 0", cfg.MaxRecordsPerSecond)
	}
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = time.Minute
	}
	seg := int64(0) // the store's default
	if cfg.MaxBytes > 0 && cfg.MaxBytes < decisions.DefaultSegmentBytes {
		seg = cfg.MaxBytes
	}
	st, err := decisions.Open(cfg.Dir, decisions.Config{Retention: cfg.Retention, MaxBytes: cfg.MaxBytes, SegmentBytes: seg}, logger)
	if err != nil {
		return nil, fmt.Errorf("decision log: %w", err)
	}
	l := &Log{
		cfg: cfg, logger: logger, nodeID: nodeID, store: st, now: time.Now,
		limiters: map[string]*limiter{},
		stop:     make(chan struct{}), done: make(chan struct{}),
	}
	if cfg.ExportFile != "" {
		if l.export, err = newExporter(cfg.ExportFile, cfg.ExportMaxBytes); err != nil {
			st.Close()
			return nil, fmt.Errorf("decision log: %w", err)
		}
	}
	if err := l.metrics(nodeID, reg); err != nil {
		_ = l.closeFiles() // the registration's error is the one to report
		return nil, err
	}
	go l.pruneLoop()
	return l, nil
}

// metrics makes and registers the log's metrics.
func (l *Log) metrics(nodeID string, reg prometheus.Registerer) error {
	labels := prometheus.Labels{"node": nodeID}
	l.received = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "policyd_decisions_received_total", ConstLabels: labels,
		Help: "Decision records this node took from its sidecars and kept, by transport (grpc, ws).",
	}, []string{"transport"})
	l.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "policyd_decisions_dropped_total", ConstLabels: labels,
		Help: "Decision records not kept: by this node (invalid, identity, rate_limited, too_large, store) or, as their sidecars reported, before shipping (sdk_buffer_full, sdk_rate_limited, sdk_mask_failed).",
	}, []string{"reason"})
	storeBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "policyd_decision_store_bytes", ConstLabels: labels,
		Help: "Bytes of this node's decision store on disk (data_dir/decisions).",
	}, func() float64 { return float64(l.store.Bytes()) })
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{l.received, l.dropped, storeBytes} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register decision log metrics: %w", err)
		}
	}
	return nil
}

// pruneLoop applies retention, and forgets the buckets of sidecars that
// have not reported for a while.
func (l *Log) pruneLoop() {
	defer close(l.done)
	t := time.NewTicker(l.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		now := l.now()
		if err := l.store.Prune(now); err != nil && !errors.Is(err, decisions.ErrClosed) {
			l.logger.Warn("decision log: retention failed", "err", err)
		}
		l.mu.Lock()
		for k, lim := range l.limiters {
			if now.Sub(lim.used) > 10*time.Minute {
				delete(l.limiters, k)
			}
		}
		l.mu.Unlock()
	}
}

// Close stops retention and closes the store and the export; later calls
// return the first's error.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		close(l.stop)
		<-l.done
		l.closeErr = l.closeFiles()
	})
	return l.closeErr
}

func (l *Log) closeFiles() error {
	err := l.store.Close()
	if l.export != nil {
		err = errors.Join(err, l.export.close())
	}
	return err
}
