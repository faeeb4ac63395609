// Package git is the Git source's driver: it fetches one repository with
// go-git into the data directory, reads the policy documents of a commit
// from the object store, and verifies the webhooks that ask for a fetch.
// Turning what it observes into Raft entries is the engine's job, in
// package sources. The operator's guide is docs/sources.md#git.
package git

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	gogit "github.com/go-git/go-git/v5"
	"golang.org/x/time/rate"

	"github.com/policyd/policyd/internal/sources"
)

// DefaultInterval is how often a source is fetched when no webhook asks.
const DefaultInterval = 30 * time.Second

// Webhooks a source takes: a burst of HookBurst, then HookRate per second.
// Each only asks for a fetch, which Watch coalesces, so more would add load
// and nothing else.
const (
	HookRate  = 1
	HookBurst = 5
)

// Config is one entry of sources.git[].
type Config struct {
	// Name is the source's name: the "NAME" of "git:NAME", and the
	// directory under data_dir/sources that holds the fetched repository.
	Name string
	// URL is the remote: https://, http://, ssh://, user@host:path or file://.
	URL string
	// Ref is a branch or a tag (or a full name under refs/).
	Ref string
	// Path is the directory of the repository whose documents are read;
	// empty reads the whole repository.
	Path string
	// Interval is how often to fetch (default DefaultInterval).
	Interval time.Duration
	// TokenFile holds a token sent as the password of HTTP basic auth. It
	// is read on each fetch, so that a rotated token is used at once.
	TokenFile string
	// SSHKeyFile is a private key for ssh:// remotes; it needs
	// KnownHostsFile, which is checked strictly.
	SSHKeyFile     string
	KnownHostsFile string
	// WebhookSecretFile holds the secret that signs webhooks.
	WebhookSecretFile string
}

// validName keeps a source's name usable as one directory name.
var validName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// Driver reads one Git source; it implements sources.Driver.
type Driver struct {
	cfg    Config
	dir    string // the bare repository
	logger *slog.Logger
	hooks  chan struct{}
	limit  *rate.Limiter

	fetchMu sync.Mutex // serialises Observe, and guards repo, last and decoded
	repo    *gogit.Repository
	last    *sources.Observation   // of the commit read last
	decoded map[string]decodedFile // of the commit read last, by file

	mu       sync.Mutex // guards what follows
	note     string
	outcomes []sources.Outcome
	reported string // a digest of the outcomes last logged
}

var _ sources.Driver = (*Driver)(nil)

// New checks cfg and returns the source's driver; it fetches nothing until
// Observe. The repository is kept in dataDir/sources/NAME.
func New(cfg Config, dataDir string, logger *slog.Logger) (*Driver, error) {
	if !validName.MatchString(cfg.Name) {
		return nil, fmt.Errorf("git source %q: name must be lowercase letters, digits, '.', '_' or '-' (at most 63)", cfg.Name)
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("git source %s: %s", cfg.Name, fmt.Sprintf(format, args...))
	}
	if cfg.URL == "" {
		return nil, fail("url is required")
	}
	if cfg.Ref == "" {
		return nil, fail("ref is required (a branch or a tag)")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Interval < 0 {
		return nil, fail("interval %v is negative", cfg.Interval)
	}
	p, err := cleanPath(cfg.Path)
	if err != nil {
		return nil, fail("%v", err)
	}
	cfg.Path = p
	if cfg.TokenFile != "" && cfg.SSHKeyFile != "" {
		return nil, fail("auth has both token_file and ssh_key_file: choose one")
	}
	if cfg.SSHKeyFile != "" && cfg.KnownHostsFile == "" {
		return nil, fail("auth.ssh_key_file needs auth.known_hosts_file: host keys are always checked")
	}
	if cfg.KnownHostsFile != "" && cfg.SSHKeyFile == "" {
		return nil, fail("auth.known_hosts_file is set without auth.ssh_key_file")
	}
	if cfg.SSHKeyFile != "" && !isSSH(cfg.URL) {
		return nil, fail("auth.ssh_key_file is set but url %s is not an ssh remote", redact(cfg.URL))
	}
	if cfg.TokenFile != "" && !isHTTP(cfg.URL) {
		return nil, fail("auth.token_file is set but url %s is not an http(s) remote", redact(cfg.URL))
	}
	if cfg.SSHKeyFile == "" && isSSH(cfg.URL) {
		return nil, fail("url %s is an ssh remote: it needs auth.ssh_key_file and auth.known_hosts_file", cfg.URL)
	}
	if dataDir == "" {
		return nil, fail("no data directory")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TokenFile != "" && strings.HasPrefix(cfg.URL, "http://") {
		logger.Warn("git source sends its token over plain http", "source", sources.GitName(cfg.Name), "url", redact(cfg.URL))
	}
	return &Driver{
		cfg:    cfg,
		dir:    filepath.Join(dataDir, "sources", cfg.Name),
		logger: logger.With("source", sources.GitName(cfg.Name)),
		hooks:  make(chan struct{}, 1),
		limit:  rate.NewLimiter(HookRate, HookBurst),
	}, nil
}

// cleanPath turns the configured path into a tree path: slash-separated,
// no leading or trailing slash, "" for the root, and never above it.
func cleanPath(p string) (string, error) {
	c := path.Clean(strings.TrimLeft(filepath.ToSlash(p), "/"))
	switch {
	case c == ".":
		return "", nil
	case c == ".." || strings.HasPrefix(c, "../"):
		return "", fmt.Errorf("path %q leaves the repository", p)
	}
	return c, nil
}

// Name is "git:NAME".
func (d *Driver) Name() string { return sources.GitName(d.cfg.Name) }

// Dir is where the fetched repository is kept.
func (d *Driver) Dir() string { return d.dir }

// Watch calls changed at once, then every interval and on every Hook, until
// ctx ends.
func (d *Driver) Watch(ctx context.Context, changed func()) error {
	// A hook that came while no one watched is covered by the first call.
	select {
	case <-d.hooks:
	default:
	}
	changed()
	tick := time.NewTicker(d.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-d.hooks:
		}
		changed()
	}
}

// Hook asks Watch for a fetch now; hooks that come before it runs are one.
func (d *Driver) Hook() {
	select {
	case d.hooks <- struct{}{}:
	default:
	}
}

// LastNote is what status should say about the last change of the ref
// beyond its outcome: a force push, which was accepted. It is "" once the
// ref moves forward again.
func (d *Driver) LastNote() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.note
}

// Report keeps the outcomes of the last sync, and logs the objects that
// were not committed once per revision.
func (d *Driver) Report(_ context.Context, outcomes []sources.Outcome) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.outcomes = append([]sources.Outcome(nil), outcomes...)
	rev := revisionOf(outcomes)
	if rev == d.reported {
		return
	}
	d.reported = rev
	for _, o := range outcomes {
		if o.State != sources.StateCommitted {
			d.logger.Warn("git source object not applied", "object", o.Object, "policy", o.Name, "state", o.State, "message", o.Message)
		}
	}
}

// revisionOf identifies a set of outcomes for Report's once-per-change log.
func revisionOf(outcomes []sources.Outcome) string {
	var b strings.Builder
	for _, o := range outcomes {
		fmt.Fprintf(&b, "%s|%s|%d|%s;", o.Object, o.State, o.Revision, o.Message)
	}
	return b.String()
}

// Outcomes returns the outcomes of the last sync.
func (d *Driver) Outcomes() []sources.Outcome {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]sources.Outcome(nil), d.outcomes...)
}
