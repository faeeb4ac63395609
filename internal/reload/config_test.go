package reload_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/reload"
	"github.com/policyd/policyd/internal/server"
	"github.com/policyd/policyd/internal/server/servertest"
)

// TestStartupValidation: a selector that is not key=value
// or an empty namespace stops the daemon at start-up with a clear message,
// rather than running a controller that would fail later.
func TestStartupValidation(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*config.Config)
		want   string
	}{
		{"selector without key=value", func(c *config.Config) { c.Reload.Selector = "helloworld" }, "reload.selector"},
		{"selector with an empty value", func(c *config.Config) { c.Reload.Selector = "app=" }, "reload.selector"},
		{"empty namespace", func(c *config.Config) { c.Reload.Namespace = " " }, "reload.namespace"},
		{"empty scope label", func(c *config.Config) { c.Reload.ScopeLabel = "" }, "reload.scope_label"},
		{"missing kubeconfig", func(c *config.Config) { c.Kubernetes.Kubeconfig = "/nonexistent/kubeconfig" }, "kubernetes.kubeconfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := nodeConfig(t, "n1", "default", 0)
			tc.mutate(&cfg)
			n, err := server.New(cfg, servertest.Logger(t), prometheus.NewRegistry())
			if err == nil {
				_ = n.Close(context.Background())
				t.Fatal("the node started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
}

// TestDisabledStatus: with reload.enabled false, GET /v1/reload answers
// with the disabled state and the (empty) replicated state.
func TestDisabledStatus(t *testing.T) {
	cfg := nodeConfig(t, "n1", "default", 0)
	cfg.Reload.Enabled = false
	n := startNode(t, cfg)
	v := n.view(t)
	if v.Controller.State != reload.StateDisabled || len(v.Cache) != 0 || len(v.Queue) != 0 {
		t.Errorf("view = %+v", v)
	}
}
