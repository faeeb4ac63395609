package config

import (
	"strings"

	"github.com/policyd/policyd/internal/admission/initrule"
)

// validateTLS checks that every TLS block names both halves of its key pair.
func (c *Config) validateTLS(p *problems) {
	for _, t := range []struct {
		key string
		tls TLS
	}{
		{"http.tls", c.HTTP.TLS},
		{"grpc.tls", c.GRPC.TLS},
		{"raft.tls", c.Raft.TLS},
		{"drift.tls", c.Drift.TLS},
	} {
		if (t.tls.CertFile == "") != (t.tls.KeyFile == "") {
			p.add(t.key, "cert_file and key_file must be set together")
		}
		if t.tls.ClientCAFile != "" && !t.tls.Enabled() {
			p.add(t.key+".client_ca_file", "needs cert_file and key_file: client certificates are only asked for over TLS")
		}
	}
}

// validateReload refuses a controller that could only fail later, as the
// seed's start-up validation does: a selector that is not key=value, or no
// namespace.
func (c *Config) validateReload(p *problems) {
	r := &c.Reload
	if !r.Enabled {
		return
	}
	if strings.TrimSpace(r.Namespace) == "" {
		p.add("reload.namespace", "must not be empty when reload.enabled is true")
	}
	if k, v, ok := strings.Cut(r.Selector, "="); !ok || strings.TrimSpace(k) == "" || strings.TrimSpace(v) == "" || strings.Contains(v, "=") {
		p.add("reload.selector", "%q must be key=value", r.Selector)
	}
	if strings.TrimSpace(r.ScopeLabel) == "" {
		p.add("reload.scope_label", "must not be empty when reload.enabled is true")
	}
	if r.Debounce < 0 {
		p.add("reload.debounce", "%v must not be negative", r.Debounce)
	}
	if strings.TrimSpace(r.AnnotationPrefix) == "" {
		p.add("reload.annotation_prefix", "must not be empty")
	}
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
