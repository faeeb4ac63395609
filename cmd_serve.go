package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/policyd/policyd/config"
	"github.com/policyd/policyd/server"
)

// shutdownTimeout bounds a graceful stop; Ctrl-C must not hang.
const shutdownTimeout = 10 * time.Second

func serveCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a policyd node (with no config: a single-node cluster in ./data on loopback)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load("", os.Environ(), cmd.Flags())
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cfg, cmd.ErrOrStderr())
		},
	}
	config.RegisterFlags(cmd.Flags())
	return cmd
}

// serve runs a node until ctx ends, then shuts it down in order.
func serve(ctx context.Context, cfg config.Config, logOut io.Writer) error {
	logger := newLogger(cfg.Log, logOut)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := bridgeRaftMetrics(reg); err != nil {
		return err
	}
	node, err := server.New(cfg, logger, reg)
	if err != nil {
		return err
	}
	node.Start()
	<-ctx.Done()
	logger.Info("signal received, stopping")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return node.Close(sctx)
}

func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

var bridgeOnce sync.Once

// bridgeRaftMetrics routes hashicorp/raft's go-metrics into reg. go-metrics
// is process-global by design, so this happens once per process, here in
// main, and never inside server.
func bridgeRaftMetrics(reg prometheus.Registerer) (err error) {
	bridgeOnce.Do(func() {
		sink, serr := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{Registerer: reg, Expiration: time.Minute})
		if serr != nil {
			err = fmt.Errorf("raft metrics sink: %w", serr)
			return
		}
		mc := gometrics.DefaultConfig("policyd")
		mc.EnableHostname = false
		mc.EnableRuntimeMetrics = false // the Go collector already reports them
		_, err = gometrics.NewGlobal(mc, sink)
	})
	return err
}
