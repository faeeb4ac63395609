package config

import (
	"strings"

	"github.com/policyd/policyd/internal/drift/admission/initrule"
)

// Drift configures the drift-detection admission webhook (every node).
type Drift struct {
	// Addr is the HTTPS listener for /admission/drift; empty = not served.
	Addr string `mapstructure:"addr"`
	TLS  TLS    `mapstructure:"tls"`
	// MaxConnections caps the webhook listener's open connections; a new
	// one over the cap is closed at once. 0 = no cap.
	MaxConnections   int    `mapstructure:"max_connections"`
	AnnotationPrefix string `mapstructure:"annotation_prefix"`
	// Mode is the default for drift: enforce (deny) or log (allow, warn).
	Mode string `mapstructure:"mode"`
	// Callbacks receive a DriftReport POST per drift (sent by the leader).
	Callbacks []string `mapstructure:"callbacks"`
	// Initialization holds per-kind initialization rules for parents, each
	// "group/Kind=Signal+Signal" or "group/Kind=default" (package
	// internal/drift/admission/initrule); rules of one kind are alternatives and replace
	// its built-in rule.
	Initialization []string `mapstructure:"initialization"`
}

// validateDrift checks the webhook's settings.
func (c *Config) validateDrift(p *problems) {
	d := &c.Drift
	p.oneOf("drift.mode", d.Mode, "enforce", "log")
	if strings.TrimSpace(d.AnnotationPrefix) == "" {
		p.add("drift.annotation_prefix", "must not be empty")
	}
	if d.Addr != "" {
		if _, _, err := splitHostPort(d.Addr); err != nil {
			p.add("drift.addr", "%v", err)
		}
		if !d.TLS.Enabled() {
			p.add("drift.tls", "cert_file and key_file are required when drift.addr is set: the API server only calls webhooks over HTTPS")
		}
	}
	for i, u := range d.Callbacks {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			p.add("drift.callbacks", "[%d] %q must be an http:// or https:// URL", i, u)
		}
	}
	for i, r := range d.Initialization {
		if _, err := initrule.Parse(r); err != nil {
			p.add("drift.initialization", "[%d] %v", i, err)
		}
	}
}
