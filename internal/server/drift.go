package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/drift/admission"
	"github.com/policyd/policyd/internal/server/drift"
	"github.com/policyd/policyd/internal/server/raftnode"
	kubesource "github.com/policyd/policyd/internal/sources/kube"
	"github.com/policyd/policyd/internal/store"
	"github.com/policyd/policyd/internal/tlsfiles"
)

// driftWebhook is the drift admission webhook of this node: the HTTPS
// listener on drift.addr (capped at drift.max_connections), the informers
// it reads parents from, the sink that proposes its effects, and the
// leader's follow-up worker.
type driftWebhook struct {
	ln       net.Listener
	srv      *http.Server
	objects  *drift.Objects
	sink     *drift.Sink
	followup *drift.Followup
	wg       sync.WaitGroup
}

// setupDrift starts the webhook when drift.addr is set, with the policy
// sources' webhook beside it. Every node serves them (the API server may
// call any of them); it serves from here on, since
// it needs nothing that Start begins: its effects go through Propose, which
// waits for a leader. The follow-up runs as a leader task.
func (n *Node) setupDrift() (err error) {
	if n.cfg.Drift.Addr == "" {
		return nil
	}
	acfg, err := admission.ConfigFromDrift(n.cfg.Drift)
	if err != nil {
		return err
	}
	certs, err := tlsfiles.New(n.cfg.Drift.TLS, n.logger.With("component", "tls", "listener", "drift.tls"))
	if err != nil {
		return fmt.Errorf("drift.tls: %w", err)
	}
	// File changes are picked up at the next handshake anyway; SIGHUP
	// re-reads at once, like the other listeners' certificates.
	n.AddSettingsHook(SettingsHook{Name: "drift.tls", Apply: func(config.Config) ([]string, []string, error) {
		if err := certs.Reload(); err != nil {
			return nil, nil, fmt.Errorf("drift.tls: %w", err)
		}
		return []string{"drift.tls"}, nil, nil
	}})
	rc, err := kubeConfig(n.cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return err
	}
	rc.UserAgent = "policyd-drift/" + n.id
	// The webhook's reads are informer-backed; the fallback GETs and the
	// leader's patches are few, but a burst after a restart must not be
	// throttled into webhook timeouts.
	rc.QPS, rc.Burst = 50, 100
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes discovery client: %w", err)
	}
	ln, err := net.Listen("tcp", n.cfg.Drift.Addr)
	if err != nil {
		return fmt.Errorf("listen drift.addr %s: %w", n.cfg.Drift.Addr, err)
	}
	logger := n.logger.With("component", "drift")
	d := &driftWebhook{ln: tls.NewListener(n.driftConns.Listener(ln), certs.ServerConfig("http/1.1"))}
	d.objects = drift.NewObjects(logger, dyn, disco)
	d.sink = drift.NewSink(logger, n.id, n)
	d.followup = drift.NewFollowup(drift.FollowupConfig{
		AnnotationPrefix: acfg.AnnotationPrefix,
		Callbacks:        n.cfg.Drift.Callbacks,
		Retention:        n.cfg.Events.Retention,
		PruneInterval:    n.cfg.Events.CleanupInterval,
	}, logger.With("task", "followup"), n.store, n, dyn, d.objects.Mapper(), nil)
	mux := http.NewServeMux()
	mux.Handle(admission.Path, admission.NewHandler(acfg, logger, d.objects, d.sink, n.reg))
	// The policy sources' validating webhook shares the listener: every
	// node refuses an invalid ToolPolicy or ValidatingPolicy at apply time
	// with the REST API's messages (docs/sources.md#kubernetes).
	mux.Handle(kubesource.AdmissionPath, kubesource.NewAdmission(n.validator, n.logger.With("component", "sources", "webhook", kubesource.AdmissionPath)))
	d.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	n.drift = d
	n.AddLeaderTask(raftnode.LeaderTask{Name: "drift-followup", Run: d.followup.Run})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.srv.Serve(d.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("drift webhook server stopped", "err", err)
		}
	}()
	logger.Info("drift webhook serving", "addr", d.ln.Addr().String(), "path", admission.Path, "mode", acfg.Mode)
	return nil
}

// closeDrift stops the webhook in order: the listener (in-flight reviews
// finish), then the sink (no more effects to propose), then the informers.
// It runs before Raft stops, so queued effects can still be proposed up to
// then.
func (n *Node) closeDrift(ctx context.Context) {
	d := n.drift
	if d == nil {
		return
	}
	if err := d.srv.Shutdown(ctx); err != nil {
		n.logger.Warn("drift webhook shutdown incomplete, closing", "err", err)
		_ = d.srv.Close()
	}
	d.wg.Wait()
	d.sink.Close()
	d.objects.Close()
}

// DriftAddr is the bound address of the drift webhook; empty when drift.addr
// is not set.
func (n *Node) DriftAddr() string {
	if n.drift == nil {
		return ""
	}
	return n.drift.ln.Addr().String()
}

// DriftObjects is the webhook's informer-backed object reader (nil when the
// webhook is off). Tests wait on its cache.
func (n *Node) DriftObjects() *drift.Objects {
	if n.drift == nil {
		return nil
	}
	return n.drift.objects
}

// SetDriftCallbacks replaces the drift.callbacks URLs (SIGHUP reload); a
// no-op when the webhook is off.
func (n *Node) SetDriftCallbacks(urls []string) {
	if n.drift != nil {
		n.drift.followup.SetCallbacks(urls)
	}
}

// driftReports counts the drift reports this node's replica holds, by
// phase; read at scrape time from the store.
type driftReports struct {
	store *store.Store
}

var driftReportsDesc = prometheus.NewDesc("policyd_drift_reports",
	"Drift reports held, by phase: Detected (drift still present) or Resolved.", []string{"phase"}, nil)

func (d *driftReports) Describe(ch chan<- *prometheus.Desc) { ch <- driftReportsDesc }

func (d *driftReports) Collect(ch chan<- prometheus.Metric) {
	reports, err := d.store.DriftReports(store.DriftFilter{})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(driftReportsDesc, err)
		return
	}
	counts := map[string]int{}
	for _, r := range reports {
		counts[r.Phase]++
	}
	for _, ph := range []string{store.PhaseDetected, store.PhaseResolved} {
		ch <- prometheus.MustNewConstMetric(driftReportsDesc, prometheus.GaugeValue, float64(counts[ph]), ph)
	}
}

// applyDriftCallbacks hands the new URLs to the drift follow-up. Without
// the webhook (drift.addr empty) nothing sends callbacks, so there is
// nothing to apply.
func (n *Node) applyDriftCallbacks(cfg config.Config) (applied, needRestart []string, err error) {
	if n.drift == nil {
		return nil, nil, nil
	}
	n.SetDriftCallbacks(cfg.Drift.Callbacks)
	return []string{"drift.callbacks"}, nil, nil
}
