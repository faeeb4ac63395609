package config

import (
	"strings"
	"time"
)

// Reload configures the ConfigMap reload controller (run by the Raft leader).
type Reload struct {
	Enabled bool `mapstructure:"enabled"`
	// Namespace watched for ConfigMaps and Deployments.
	Namespace string `mapstructure:"namespace"`
	// Selector (key=value) picks the ConfigMaps and the Deployments.
	Selector string `mapstructure:"selector"`
	// ScopeLabel is the label whose value ties a ConfigMap to Deployments.
	ScopeLabel string `mapstructure:"scope_label"`
	// Debounce delays a restart after a ConfigMap change; a further change
	// inside the window pushes it back, so the changes coalesce into one.
	Debounce time.Duration `mapstructure:"debounce"`
	// AnnotationPrefix prefixes restartedAt and config-hash-<cm>.
	AnnotationPrefix string `mapstructure:"annotation_prefix"`
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
