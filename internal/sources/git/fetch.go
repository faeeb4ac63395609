package git

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"

	"github.com/policyd/policyd/internal/sources"
)

// fetchTimeout bounds one fetch, so that a remote that stops answering
// fails the read instead of holding the source.
const fetchTimeout = 2 * time.Minute

// fetchedRef is where the bare repository keeps the commit last read: the
// commit a force push is measured against, across restarts.
const fetchedRef = plumbing.ReferenceName("refs/policyd/fetched")

// tokenUser is the user name sent with a token: GitHub and GitLab take any
// non-empty name with a token as the password.
const tokenUser = "x-access-token"

// FetchError is an Observe that could not read the remote: unreachable,
// refused credentials, no such ref. Nothing was observed.
type FetchError struct {
	Source string // "git:NAME"
	URL    string // without any password
	Err    error
}

// Error is one line naming the source, the remote and the cause.
func (e *FetchError) Error() string {
	return strings.ReplaceAll(fmt.Sprintf("%s: fetch %s: %v", e.Source, e.URL, e.Err), "\n", "; ")
}

// Unwrap returns the cause.
func (e *FetchError) Unwrap() error { return e.Err }

// ErrRefNotFound is the cause of a FetchError when the remote has no
// branch or tag of the configured name.
var ErrRefNotFound = errors.New("ref not found on the remote")

// Observe fetches the ref and reads the policy documents of its commit.
func (d *Driver) Observe(ctx context.Context) (*sources.Observation, error) {
	d.fetchMu.Lock()
	defer d.fetchMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	commit, err := d.fetch(ctx)
	if err != nil {
		return nil, &FetchError{Source: d.Name(), URL: redact(d.cfg.URL), Err: err}
	}
	// A commit reads the same every time: a poll that finds the ref where
	// it was costs the ref listing and no decoding.
	if d.last != nil && d.last.Revision == commit.Hash.String() {
		return clone(d.last), nil
	}
	obs, err := d.read(commit)
	if err != nil {
		return nil, fmt.Errorf("%s: read commit %s: %w", d.Name(), commit.Hash, err)
	}
	d.last = obs
	return clone(obs), nil
}

// clone copies an observation deeply enough that what the caller does to
// its policies never reaches the cached one.
func clone(obs *sources.Observation) *sources.Observation {
	c := *obs
	c.Invalid = slices.Clone(obs.Invalid)
	c.Policies = make([]sources.Declared, len(obs.Policies))
	for i, d := range obs.Policies {
		p := *d.Policy
		p.Labels = maps.Clone(d.Policy.Labels)
		p.Spec = slices.Clone(d.Policy.Spec)
		d.Policy = &p
		c.Policies[i] = d
	}
	return &c
}

// fetch brings the ref's commit into the local repository and returns it.
func (d *Driver) fetch(ctx context.Context) (*object.Commit, error) {
	repo, err := d.open()
	if err != nil {
		return nil, err
	}
	auth, err := d.auth()
	if err != nil {
		return nil, err
	}
	remote := gogit.NewRemote(repo.Storer, &config.RemoteConfig{Name: "origin", URLs: []string{d.cfg.URL}})
	refs, err := remote.ListContext(ctx, &gogit.ListOptions{Auth: auth})
	if err != nil {
		return nil, d.cause(err)
	}
	name, hash, ok := resolve(refs, d.cfg.Ref)
	if !ok {
		return nil, fmt.Errorf("%w: no branch or tag %q", ErrRefNotFound, d.cfg.Ref)
	}
	old, err := repo.Reference(fetchedRef, true)
	if err != nil && !errors.Is(err, plumbing.ErrReferenceNotFound) {
		return nil, fmt.Errorf("read %s: %w", fetchedRef, err)
	}
	if _, err := repo.Storer.EncodedObject(plumbing.AnyObject, hash); err == nil {
		// Already here (the ref did not move, or went back to a commit read
		// before): no need to ask the remote for it.
		if err := repo.Storer.SetReference(plumbing.NewHashReference(fetchedRef, hash)); err != nil {
			return nil, fmt.Errorf("set %s: %w", fetchedRef, err)
		}
	} else {
		err := remote.FetchContext(ctx, &gogit.FetchOptions{
			RefSpecs: []config.RefSpec{config.RefSpec("+" + name.String() + ":" + fetchedRef.String())},
			Auth:     auth,
			Tags:     gogit.NoTags,
			Force:    true,
		})
		if err != nil && !errors.Is(err, gogit.NoErrAlreadyUpToDate) {
			return nil, d.cause(err)
		}
	}
	ref, err := repo.Reference(fetchedRef, true)
	if err != nil {
		return nil, fmt.Errorf("read %s after the fetch: %w", fetchedRef, err)
	}
	commit, err := peel(repo, ref.Hash())
	if err != nil {
		return nil, fmt.Errorf("ref %s: %w", name, err)
	}
	if old == nil || old.Hash() != ref.Hash() {
		d.logger.Debug("git source fetched a new commit", "ref", name.String(), "commit", commit.Hash.String())
	}
	if old != nil && old.Hash() != ref.Hash() {
		d.moved(repo, old.Hash(), commit)
	}
	return commit, nil
}

// moved notes how the ref moved from the commit last read: forward clears
// the note, anything else is a force push, accepted (it is how operators
// revert) and noted.
func (d *Driver) moved(repo *gogit.Repository, oldHash plumbing.Hash, commit *object.Commit) {
	oldCommit, err := peel(repo, oldHash)
	if err != nil {
		return
	}
	forward, err := oldCommit.IsAncestor(commit)
	if err != nil {
		d.logger.Warn("git source cannot tell whether the ref moved forward", "old", oldCommit.Hash.String(), "new", commit.Hash.String(), "err", err)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if forward {
		d.note = ""
		return
	}
	d.note = fmt.Sprintf("ref %s was force-pushed from %s to %s, which does not descend from it: the new commit is read", d.cfg.Ref, short(oldCommit.Hash), short(commit.Hash))
	d.logger.Warn("git source ref was force-pushed; reading the new commit", "ref", d.cfg.Ref, "old", oldCommit.Hash.String(), "new", commit.Hash.String())
}

func short(h plumbing.Hash) string { return h.String()[:12] }

// open opens the bare repository, creating it on first use.
func (d *Driver) open() (*gogit.Repository, error) {
	if d.repo != nil {
		return d.repo, nil
	}
	repo, err := gogit.PlainOpen(d.dir)
	if errors.Is(err, gogit.ErrRepositoryNotExists) {
		if err := os.MkdirAll(filepath.Dir(d.dir), 0o750); err != nil {
			return nil, fmt.Errorf("create %s: %w", filepath.Dir(d.dir), err)
		}
		repo, err = gogit.PlainInit(d.dir, true)
	}
	if err != nil {
		return nil, fmt.Errorf("open repository %s: %w", d.dir, err)
	}
	d.repo = repo
	return repo, nil
}

// auth reads the credentials afresh, so that a rotated file is used at once.
func (d *Driver) auth() (transport.AuthMethod, error) {
	switch {
	case d.cfg.TokenFile != "":
		b, err := os.ReadFile(d.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("read auth.token_file: %w", err)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return nil, fmt.Errorf("auth.token_file %s is empty", d.cfg.TokenFile)
		}
		return &githttp.BasicAuth{Username: tokenUser, Password: token}, nil
	case d.cfg.SSHKeyFile != "":
		keys, err := gitssh.NewPublicKeysFromFile(sshUser(d.cfg.URL), d.cfg.SSHKeyFile, "")
		if err != nil {
			return nil, fmt.Errorf("read auth.ssh_key_file %s: %w", d.cfg.SSHKeyFile, err)
		}
		check, err := gitssh.NewKnownHostsCallback(d.cfg.KnownHostsFile)
		if err != nil {
			return nil, fmt.Errorf("read auth.known_hosts_file %s: %w", d.cfg.KnownHostsFile, err)
		}
		keys.HostKeyCallback = check
		return keys, nil
	}
	return nil, nil
}

// cause says in operator's words why the remote refused. go-git's own
// sentinels stand alone: what follows them is the server's body.
func (d *Driver) cause(err error) error {
	auth := errors.Is(err, transport.ErrAuthenticationRequired) || errors.Is(err, transport.ErrAuthorizationFailed)
	switch {
	case auth && d.cfg.TokenFile == "" && d.cfg.SSHKeyFile == "":
		return fmt.Errorf("%w (no auth is configured)", sentinel(err))
	case auth && d.cfg.TokenFile != "":
		return fmt.Errorf("%w: the remote refused the token of auth.token_file", sentinel(err))
	case auth:
		return fmt.Errorf("%w: the remote refused the key of auth.ssh_key_file", sentinel(err))
	case errors.Is(err, transport.ErrRepositoryNotFound):
		return transport.ErrRepositoryNotFound
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return fmt.Errorf("%w: no ref %q to read", transport.ErrEmptyRemoteRepository, d.cfg.Ref)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer within %v: %w", fetchTimeout, context.DeadlineExceeded)
	}
	// The net error says it without the request's URL.
	var op *net.OpError
	if errors.As(err, &op) {
		return op
	}
	// go-git's messages may quote the URL as configured.
	if raw, safe := d.cfg.URL, redact(d.cfg.URL); raw != safe {
		return errors.New(strings.ReplaceAll(err.Error(), raw, safe))
	}
	return err
}

// sentinel is the go-git authentication error that err wraps.
func sentinel(err error) error {
	if errors.Is(err, transport.ErrAuthorizationFailed) {
		return transport.ErrAuthorizationFailed
	}
	return transport.ErrAuthenticationRequired
}

// resolve finds ref on the remote: a full name, or a branch before a tag.
func resolve(refs []*plumbing.Reference, ref string) (plumbing.ReferenceName, plumbing.Hash, bool) {
	want := []plumbing.ReferenceName{plumbing.NewBranchReferenceName(ref), plumbing.NewTagReferenceName(ref)}
	if strings.HasPrefix(ref, "refs/") {
		want = []plumbing.ReferenceName{plumbing.ReferenceName(ref)}
	}
	for _, w := range want {
		for _, r := range refs {
			if r.Name() == w && r.Type() == plumbing.HashReference {
				return w, r.Hash(), true
			}
		}
	}
	return "", plumbing.ZeroHash, false
}

// peel follows annotated tags to the commit they name.
func peel(repo *gogit.Repository, h plumbing.Hash) (*object.Commit, error) {
	for range 10 {
		obj, err := repo.Object(plumbing.AnyObject, h)
		if err != nil {
			return nil, fmt.Errorf("object %s: %w", h, err)
		}
		switch o := obj.(type) {
		case *object.Commit:
			return o, nil
		case *object.Tag:
			h = o.Target
		default:
			return nil, fmt.Errorf("points at a %s, not a commit", obj.Type())
		}
	}
	return nil, errors.New("tags nested too deep")
}

func isHTTP(u string) bool {
	return strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")
}

// isSSH reports an ssh:// URL or an scp-like user@host:path.
func isSSH(u string) bool {
	if strings.HasPrefix(u, "ssh://") || strings.HasPrefix(u, "git+ssh://") {
		return true
	}
	ep, err := transport.NewEndpoint(u)
	return err == nil && ep.Protocol == "ssh"
}

// sshUser is the user of an ssh remote, "git" when the URL names none.
func sshUser(u string) string {
	if ep, err := transport.NewEndpoint(u); err == nil && ep.User != "" {
		return ep.User
	}
	return "git"
}

// redact drops a password from an http(s) URL, for messages and logs.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	return p.Redacted()
}
