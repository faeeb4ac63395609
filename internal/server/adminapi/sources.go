package adminapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/server/apierror"
	"github.com/policyd/policyd/internal/sources"
	"github.com/policyd/policyd/internal/store"
)

// sourcer is the part of the Backend that knows the configured policy
// sources (docs/sources.md).
type sourcer interface {
	// SourceNames lists the configured sources, in configuration order.
	SourceNames() []string
	// SourceStatus is this node's reconciler status of a configured
	// source; running only on the leader. ok is false for a name that is
	// not configured.
	SourceStatus(name string) (st sources.Status, ok bool)
	// VerifySourceHook checks a webhook for a configured Git source:
	// sources.ErrNotConfigured, ErrHookRefused or ErrRateLimited.
	VerifySourceHook(name string, h http.Header, body []byte) error
	// LeaderHTTPAddr is the leader's admin address, "" if unknown.
	LeaderHTTPAddr() string
}

// SourceList is GET /v1/sources.
type SourceList struct {
	Sources []SourceView `json:"sources"`
	// Leader is the leader's admin address: only its answer holds the
	// reconcilers' status (last read, last error, prune refusal).
	Leader       string `json:"leader_http_addr,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
}

// SourceView is one source: its replicated record, the policies it owns,
// and, from the leader, its reconciler's status.
type SourceView struct {
	Name string `json:"name"`
	// SyncedRevision is what its last committed sync read, at SyncedAt
	// and index SyncIndex.
	SyncedRevision string    `json:"synced_revision,omitempty"`
	SyncedAt       time.Time `json:"synced_at,omitzero"`
	SyncIndex      uint64    `json:"sync_index,omitempty"`
	Policies       int       `json:"policies"`
	Owned          []string  `json:"owned"`
	// PruneAllowed is a grant to prune (sources sync --allow-prune) that
	// no sync has used yet.
	PruneAllowed bool            `json:"prune_allowed,omitempty"`
	Reconciler   *sources.Status `json:"reconciler,omitempty"`
}

// SyncRequested is the answer to a sync request or a webhook: the index of
// the request the leader's reconciler answers.
type SyncRequested struct {
	Source       string `json:"source"`
	RequestIndex uint64 `json:"request_index"`
	AllowPrune   bool   `json:"allow_prune,omitempty"`
}

func (a *API) routeSources() {
	a.route("GET /v1/sources", auth.RoleRead, a.listSources)
	a.route("GET /v1/sources/{name}", auth.RoleRead, a.getSource)
	a.route("POST /v1/sources/{name}/sync", auth.RoleAdmin, a.syncSource)
	// The webhook carries no admin token: its signature is its credential.
	a.route("POST /v1/sources/{name}/hook", auth.Role(-1), a.sourceHook)
}

func (a *API) sourceViews(ctx context.Context, names []string) ([]SourceView, error) {
	recs, err := a.b.Store().Sources()
	if err != nil {
		return nil, err
	}
	byName := map[string]store.SourceRecord{}
	for _, r := range recs {
		byName[r.Source] = r
	}
	out := make([]SourceView, 0, len(names))
	if len(names) == 0 {
		return out, ctx.Err() // no source: no policy to read for owners
	}
	ps, err := a.b.Store().ListPolicies(store.PolicyFilter{})
	if err != nil {
		return nil, err
	}
	owned := map[string][]string{}
	for _, p := range ps {
		if p.Source != "" {
			owned[p.Source] = append(owned[p.Source], p.Name)
		}
	}
	for _, n := range names {
		rec := byName[n]
		v := SourceView{
			Name: n, SyncedRevision: rec.Revision, SyncedAt: rec.SyncedAt, SyncIndex: rec.SyncIndex,
			Policies: len(owned[n]), Owned: owned[n], PruneAllowed: rec.AllowPrune,
		}
		if v.Owned == nil {
			v.Owned = []string{}
		}
		if st, ok := a.b.SourceStatus(n); ok && st.Running {
			v.Reconciler = &st
		}
		out = append(out, v)
	}
	return out, ctx.Err()
}

func (a *API) listSources(w http.ResponseWriter, r *http.Request) error {
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	idx := a.b.Store().AppliedIndex()
	views, err := a.sourceViews(r.Context(), a.b.SourceNames())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, SourceList{Sources: views, Leader: a.b.LeaderHTTPAddr(), AppliedIndex: idx})
	return nil
}

// sourceName is the source a path names: "kubernetes", "git:NAME", or a
// Git source's bare NAME, as a webhook URL says it.
func sourceName(r *http.Request) string {
	n := r.PathValue("name")
	if n == sources.Kubernetes || strings.HasPrefix(n, "git:") {
		return n
	}
	return sources.GitName(n)
}

func (a *API) getSource(w http.ResponseWriter, r *http.Request) error {
	name := sourceName(r)
	if _, ok := a.b.SourceStatus(name); !ok {
		return fmt.Errorf("source %q: %w", name, sources.ErrNotConfigured)
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	views, err := a.sourceViews(r.Context(), []string{name})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, views[0])
	return nil
}

func (a *API) syncSource(w http.ResponseWriter, r *http.Request) error {
	name := sourceName(r)
	if _, ok := a.b.SourceStatus(name); !ok {
		return fmt.Errorf("source %q: %w", name, sources.ErrNotConfigured)
	}
	allow := false
	if v := r.URL.Query().Get("allow_prune"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return badRequest(fmt.Sprintf("allow_prune: %q is not a boolean", v))
		}
		allow = b
	}
	return a.requestSync(w, r, name, allow)
}

func (a *API) sourceHook(w http.ResponseWriter, r *http.Request) error {
	name := sourceName(r)
	// A push's payload is a few KB; only its signature matters here.
	body, err := io.ReadAll(r.Body)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return &apiError{status: http.StatusRequestEntityTooLarge, code: apierror.CodeInvalid, msg: fmt.Sprintf("webhook body exceeds %d bytes", mbe.Limit)}
	case err != nil:
		return fmt.Errorf("read webhook body: %w", err)
	}
	if err := a.b.VerifySourceHook(name, r.Header, body); err != nil {
		return fmt.Errorf("source %q: %w", name, err)
	}
	r = r.WithContext(context.WithValue(r.Context(), ctxActor, "hook:"+name))
	return a.requestSync(w, r, name, false)
}

// requestSync commits a sync request, which wakes the leader's reconciler
// wherever it runs.
func (a *API) requestSync(w http.ResponseWriter, r *http.Request, name string, allowPrune bool) error {
	cmd, err := command.RequestSourceSync(name, allowPrune)
	if err != nil {
		return badRequest(err.Error())
	}
	res, err := a.commit(r, cmd)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, SyncRequested{Source: name, RequestIndex: res.GetIndex(), AllowPrune: allowPrune})
	return nil
}
