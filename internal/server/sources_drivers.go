package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/policyd/policyd/internal/sources"
	gitsource "github.com/policyd/policyd/internal/sources/git"
	kubesource "github.com/policyd/policyd/internal/sources/kube"
)

// sourceDrivers builds a driver per configured source. Nothing contacts a
// source until this node leads.
func (n *Node) sourceDrivers() ([]sources.Driver, error) {
	var out []sources.Driver
	if n.cfg.Sources.Kubernetes.Enabled {
		rc, err := kubeConfig(n.cfg.Kubernetes.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("sources.kubernetes: %w", err)
		}
		rc.UserAgent = "policyd-sources/" + n.id
		d, err := kubesource.New(kubesource.Config{}, rc, newFleet(n), n.logger.With("component", "sources", "source", sources.Kubernetes))
		if err != nil {
			return nil, fmt.Errorf("sources.kubernetes: %w", err)
		}
		out = append(out, d)
	}
	for _, g := range n.cfg.Sources.Git {
		d, err := gitsource.New(gitsource.Config{
			Name: g.Name, URL: g.URL, Ref: g.Ref, Path: g.Path, Interval: g.Interval,
			TokenFile: g.Auth.TokenFile, SSHKeyFile: g.Auth.SSHKeyFile, KnownHostsFile: g.Auth.KnownHostsFile,
			WebhookSecretFile: g.WebhookSecretFile,
		}, n.cfg.DataDir, n.logger.With("component", "sources", "source", sources.GitName(g.Name)))
		if err != nil {
			return nil, fmt.Errorf("sources.git %q: %w", g.Name, err)
		}
		out = append(out, gitHooks{d})
	}
	return out, nil
}

// gitHooks is a Git source's driver with its webhook check.
type gitHooks struct{ *gitsource.Driver }

// VerifyHook checks a webhook's signature against the source's secret, and
// its rate.
func (g gitHooks) VerifyHook(h http.Header, body []byte) error {
	secret, err := g.WebhookSecret()
	if errors.Is(err, gitsource.ErrNoWebhookSecret) {
		return fmt.Errorf("%w: %w", sources.ErrNotConfigured, err)
	}
	if err != nil {
		return err
	}
	if err := gitsource.VerifyHook(secret, h, body); err != nil {
		return fmt.Errorf("%w: %w", sources.ErrHookRefused, err)
	}
	if !g.AllowHook() {
		return sources.ErrRateLimited
	}
	return nil
}
