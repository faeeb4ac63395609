package cli

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/server"
	"github.com/policyd/policyd/internal/server/raftlog"
)

// shutdownTimeout bounds a graceful stop; Ctrl-C must not hang.
const shutdownTimeout = 10 * time.Second

func serveCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a policyd node (with no config: a single-node cluster in ./data on loopback)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			load := func() (config.Config, error) { return config.Load("", os.Environ(), cmd.Flags()) }
			cfg, err := load()
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cfg, load, cmd.ErrOrStderr())
		},
	}
	config.RegisterFlags(cmd.Flags())
	return cmd
}

// serve runs a node until ctx ends, then shuts it down in order. On SIGHUP
// it loads the configuration again (reload, the same file, environment and
// flags) and applies its run-time settings; see server.Node.ApplySettings.
func serve(ctx context.Context, cfg config.Config, reload func() (config.Config, error), logOut io.Writer) error {
	out := &lastLineWriter{w: logOut}
	logger, level := newLogger(cfg.Log, out)
	// client-go logs through klog's process-wide logger; route it to ours so
	// the reload controller's and the webhook's client messages share the
	// format and level.
	klog.SetSlogLogger(logger.With("component", "kubernetes"))
	// Subscribe first: SIGHUP's default action is to exit, and one sent
	// while the node starts is applied once it has.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	if err := bridgeRaftMetrics(reg); err != nil {
		return err
	}
	node, err := server.New(cfg, logger, reg)
	if err != nil {
		return lastLine(cfg.Log, out, err)
	}
	node.SetLogLevel(level)
	node.Start()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-hup:
			handleSIGHUP(node, reload, logger)
		case <-node.Faulted():
			return lastLine(cfg.Log, out, node.Fault())
		}
	}
	logger.Info("signal received, stopping")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	// A write that fails while the node stops (a leadership transfer's)
	// parks raft, and Close would wait on it for ever.
	closed := make(chan error, 1)
	go func() { closed <- node.Close(sctx) }()
	select {
	case err := <-closed:
		return err
	case <-node.Faulted():
		return lastLine(cfg.Log, out, node.Fault())
	}
}

// handleSIGHUP handles one SIGHUP. A configuration that does not load
// changes nothing; the node logs what it applied and what needs a restart.
func handleSIGHUP(node *server.Node, reload func() (config.Config, error), logger *slog.Logger) {
	logger.Info("SIGHUP received, reloading the configuration")
	cfg, err := reload()
	if err != nil {
		logger.Error("configuration not reloaded: it does not load; nothing changed", "err", err)
		return
	}
	_, _, _ = node.ApplySettings(cfg) // logged by the node
}

// newLogger returns the process logger and its level, which SIGHUP may
// change.
func newLogger(c config.Log, w io.Writer) (*slog.Logger, *slog.LevelVar) {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level)) // validated by config
	level := &slog.LevelVar{}
	level.Set(lvl)
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), level
	}
	return slog.New(slog.NewTextHandler(w, opts)), level
}

// lastLine ends serve on a damaged data file or a failed write
// (raftlog.DataError): it logs the error as the process's last line, one
// ERROR record with the file, what is wrong and the recovery, and returns
// it marked as reported, so that main exits non-zero without printing it
// again. Lines other goroutines log after it are dropped: the node is
// exiting, and the last line says why. Other errors are returned as they
// are.
func lastLine(c config.Log, out *lastLineWriter, err error) error {
	var de *raftlog.DataError
	if !errors.As(err, &de) {
		return err
	}
	final, _ := newLogger(c, out.seal())
	msg := "a data file is damaged; the node does not start"
	if de.Write {
		msg = "a write to the data directory failed; the node stops"
	}
	final.Error(msg, "file", de.Path, "err", de.Err.Error(), "recovery", de.Recovery)
	return &reportedError{err}
}

// lastLineWriter passes log records through until seal.
type lastLineWriter struct {
	mu     sync.Mutex
	w      io.Writer
	sealed bool
}

func (l *lastLineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sealed {
		return len(p), nil
	}
	return l.w.Write(p)
}

// seal drops every later Write and returns the underlying writer.
func (l *lastLineWriter) seal() io.Writer {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sealed = true
	return l.w
}
