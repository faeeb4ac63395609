package config

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Sources configures the policy sources the leader reconciles
// (docs/sources.md).
type Sources struct {
	// Debounce coalesces a source's changes into one sync (at most 1 s
	// after the first).
	Debounce time.Duration `mapstructure:"debounce"`
	// MaxPruneRatio is the share of a source's policies one sync may
	// delete before it waits for policyd sources sync --allow-prune.
	MaxPruneRatio float64          `mapstructure:"max_prune_ratio"`
	Kubernetes    SourceKubernetes `mapstructure:"kubernetes"`
	Git           []SourceGit      `mapstructure:"git"`
}

// SourceKubernetes is the Kubernetes source: ToolPolicy and
// ValidatingPolicy resources, through kubernetes.kubeconfig.
type SourceKubernetes struct {
	Enabled bool `mapstructure:"enabled"`
}

// SourceGit is one Git repository of policy documents.
type SourceGit struct {
	Name string `mapstructure:"name"`
	URL  string `mapstructure:"url"`
	// Ref is a branch or a tag.
	Ref  string `mapstructure:"ref"`
	Path string `mapstructure:"path"`
	// Interval is how often the leader fetches without a webhook.
	Interval          time.Duration `mapstructure:"interval"`
	Auth              GitAuth       `mapstructure:"auth"`
	WebhookSecretFile string        `mapstructure:"webhook_secret_file"`
}

// GitAuth is how a Git source authenticates: a token over HTTPS, or an SSH
// key checked against known hosts.
type GitAuth struct {
	TokenFile      string `mapstructure:"token_file"`
	SSHKeyFile     string `mapstructure:"ssh_key_file"`
	KnownHostsFile string `mapstructure:"known_hosts_file"`
}

// DefaultGitInterval is a Git source's interval when it sets none.
const DefaultGitInterval = 30 * time.Second

// gitName is a Git source's name: it becomes the source "git:NAME" and a
// directory under data_dir/sources.
var gitName = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// validateSources refuses sources that could only fail later: a bad name
// (it becomes the source "git:NAME" and a directory), two of one name, no
// URL or ref, an SSH key without known hosts.
func (c *Config) validateSources(p *problems) {
	s := &c.Sources
	if s.Debounce < 0 || s.Debounce > time.Second {
		p.add("sources.debounce", "%v must be within 0s..1s", s.Debounce)
	}
	if s.MaxPruneRatio < 0 || s.MaxPruneRatio > 1 {
		p.add("sources.max_prune_ratio", "%v must be within 0..1", s.MaxPruneRatio)
	}
	seen := map[string]bool{}
	for i := range s.Git {
		g := &s.Git[i]
		key := func(k string) string { return fmt.Sprintf("sources.git[%d].%s", i, k) }
		switch {
		case !gitName.MatchString(g.Name):
			p.add(key("name"), "%q must be lowercase letters, digits, '.' and '-', at most 63", g.Name)
		case seen[g.Name]:
			p.add(key("name"), "%q is configured twice", g.Name)
		}
		seen[g.Name] = true
		if strings.TrimSpace(g.URL) == "" {
			p.add(key("url"), "must not be empty")
		}
		if strings.TrimSpace(g.Ref) == "" {
			p.add(key("ref"), "must name a branch or a tag")
		}
		if g.Interval != 0 && g.Interval < time.Second {
			p.add(key("interval"), "%v must be at least 1s (0: %v)", g.Interval, DefaultGitInterval)
		}
		if g.Auth.SSHKeyFile != "" && g.Auth.KnownHostsFile == "" {
			p.add(key("auth.known_hosts_file"), "required with auth.ssh_key_file: host keys are always checked")
		}
		if g.Auth.SSHKeyFile != "" && g.Auth.TokenFile != "" {
			p.add(key("auth"), "set token_file or ssh_key_file, not both")
		}
	}
}
