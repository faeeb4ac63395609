package adminapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/policyd/policyd/internal/command"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// PolicyList is GET /v1/policies.
type PolicyList struct {
	Policies []*policy.Policy `json:"policies"`
	// Version is the policy-set version of the identity given by org, team
	// and employee: what a sidecar with that identity holds
	// when it is current. Only set when an identity and no kind is given.
	Version string `json:"version,omitempty"`
	// AppliedIndex is the local replica's position when it was read.
	AppliedIndex uint64 `json:"applied_index"`
}

// identityFilter reads org/team/employee: the policies that apply to that
// identity. A team or employee without an org names nobody.
func identityFilter(r *http.Request) (*policy.Identity, error) {
	q := r.URL.Query()
	id := policy.Identity{Org: q.Get("org"), Team: q.Get("team"), Employee: q.Get("employee")}
	if id == (policy.Identity{}) {
		return nil, nil
	}
	if id.Org == "" {
		return nil, badRequest("org: required when team or employee is given")
	}
	return &id, nil
}

// nonNil makes empty lists encode as [] rather than null.
func nonNil[T any](s []*T) []*T {
	if s == nil {
		return []*T{}
	}
	return s
}

func (a *API) listPolicies(w http.ResponseWriter, r *http.Request) error {
	id, err := identityFilter(r)
	if err != nil {
		return err
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	summary, err := queryBool(r, "summary")
	if err != nil {
		return err
	}
	kind := r.URL.Query().Get("kind")
	if id != nil && kind == "" {
		set, err := a.b.Store().PolicySet(*id)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, PolicyList{Policies: withoutSpecs(nonNil(set.Policies), summary), Version: set.Version, AppliedIndex: set.Index})
		return nil
	}
	idx := a.b.Store().AppliedIndex()
	ps, err := a.b.Store().ListPolicies(store.PolicyFilter{Identity: id, Kind: kind})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, PolicyList{Policies: withoutSpecs(nonNil(ps), summary), AppliedIndex: idx})
	return nil
}

// withoutSpecs drops every spec when summary is set: a listing of a
// thousand policies is then names and metadata, not megabytes of specs.
func withoutSpecs(ps []*policy.Policy, summary bool) []*policy.Policy {
	if !summary {
		return ps
	}
	out := make([]*policy.Policy, len(ps))
	for i, p := range ps {
		c := *p
		c.Spec = nil
		out[i] = &c
	}
	return out
}

// entity describes a keyed resource (policies, employees) for the shared
// get, put and delete handlers: the steps are the same, only the types,
// key rules and commands differ.
type entity[T any] struct {
	param string // path parameter and JSON key field: "name" or "id"
	typ   store.EntityType
	// decodeStored reads an event's data (the stored form) back.
	decodeStored func([]byte) (*T, error)
	validKey     func(string) error
	decode       func([]byte) (*T, error)
	key          func(*T) *string
	validate     func(*T) error
	get          func(string) (*T, error)
	// stored, when set, reads the entity's stored JSON with its revision,
	// which a GET serves as it is: policies, whose specs are large and
	// already canonical, so that a read is a copy, not a re-encode.
	stored   func(string) ([]byte, uint64, error)
	revision func(*T) uint64
	put      func(*T, *uint64) (*command.Command, error)
	del      func(string, *uint64) (*command.Command, error)
}

func (a *API) policies() entity[policy.Policy] {
	return entity[policy.Policy]{
		param: "name", validKey: policy.ValidPolicyName, decode: policy.DecodePolicy,
		typ: store.EntityPolicy, decodeStored: policy.DecodeStored,
		key:      func(p *policy.Policy) *string { return &p.Name },
		validate: func(p *policy.Policy) error { return a.b.Validator().Policy(p) },
		get:      func(k string) (*policy.Policy, error) { return a.b.Store().GetPolicy(k) },
		stored:   func(k string) ([]byte, uint64, error) { return a.b.Store().StoredPolicy(k) },
		revision: func(p *policy.Policy) uint64 { return p.Revision },
		put:      command.PutPolicy, del: command.DeletePolicy,
	}
}

func (a *API) employees() entity[policy.Employee] {
	return entity[policy.Employee]{
		param: "id", validKey: policy.ValidEmployeeID, decode: policy.DecodeEmployee,
		typ: store.EntityEmployee, decodeStored: decodeStoredEmployee,
		key:      func(e *policy.Employee) *string { return &e.ID },
		validate: func(e *policy.Employee) error { return a.b.Validator().Employee(e) },
		get:      func(k string) (*policy.Employee, error) { return a.b.Store().GetEmployee(k) },
		revision: func(e *policy.Employee) uint64 { return e.Revision },
		put:      command.PutEmployee, del: command.DeleteEmployee,
	}
}

// pathKey reads and checks the resource key from the path.
func (e entity[T]) pathKey(r *http.Request) (string, error) {
	k := r.PathValue(e.param)
	return k, e.validKey(k)
}

// target reads the key and the If-Match precondition of a write.
func (e entity[T]) target(r *http.Request) (string, *uint64, error) {
	key, err := e.pathKey(r)
	if err != nil {
		return "", nil, err
	}
	cond, err := ifMatch(r)
	return key, cond, err
}

// write answers with the local replica's copy and its revision as ETag.
func (e entity[T]) write(w http.ResponseWriter, key string) error {
	if e.stored != nil {
		raw, rev, err := e.stored(key)
		if err != nil {
			return err
		}
		w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(rev, 10)))
		writeRawJSON(w, http.StatusOK, raw)
		return nil
	}
	v, err := e.get(key)
	if err != nil {
		return err
	}
	return e.writeValue(w, v)
}

func (e entity[T]) writeValue(w http.ResponseWriter, v *T) error {
	w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(e.revision(v), 10)))
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (e entity[T]) getHandler(a *API) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		key, err := e.pathKey(r)
		if err != nil {
			return err
		}
		if err := a.maybeConsistent(r); err != nil {
			return err
		}
		return e.write(w, key)
	}
}

// putHandler creates or replaces; the body's key may be omitted, but if
// given it must match the path.
func (e entity[T]) putHandler(a *API) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		key, cond, err := e.target(r)
		if err != nil {
			return err
		}
		body, err := readBody(r)
		if err != nil {
			return err
		}
		v, err := e.decode(body)
		if err != nil {
			return err
		}
		if k := e.key(v); *k == "" {
			*k = key
		} else if *k != key {
			return badRequest(fmt.Sprintf("%s: %q does not match the path's %q", e.param, *k, key))
		}
		if err := e.validate(v); err != nil {
			return err
		}
		cmd, err := e.put(v, cond)
		if err != nil {
			return err
		}
		res, err := a.commit(r, cmd)
		if err != nil {
			return err
		}
		return e.answerPut(w, r, a, key, res)
	}
}

// answerPut answers a committed put (PUT or revert) with the entity as it
// stored it.
func (e entity[T]) answerPut(w http.ResponseWriter, r *http.Request, a *API, key string, res *commandv1.Result) error {
	if raw := res.GetValue(); len(raw) > 0 {
		// The leader's FSM stored these bytes: answer with them now,
		// without waiting for this node to apply the entry.
		w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(res.GetRevision(), 10)))
		writeRawJSON(w, http.StatusOK, raw)
		return nil
	}
	// A leader that does not send the stored value (an older version).
	if err := a.b.Store().WaitApplied(r.Context(), res.GetIndex()); err != nil {
		return err
	}
	return e.writeCommitted(w, a, key, res.GetIndex())
}

// writeCommitted answers a PUT with the entity as this write stored it. The
// local copy is read first; if a later write has already replaced or
// deleted it (a concurrent DELETE can land between commit and read-back),
// the answer comes from this write's own event, so a committed PUT is never
// answered 404 or with another write's revision.
func (e entity[T]) writeCommitted(w http.ResponseWriter, a *API, key string, index uint64) error {
	v, err := e.get(key)
	if err == nil && e.revision(v) == index {
		return e.writeValue(w, v)
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	page, err := a.b.Store().ListEvents(store.EventFilter{After: index - 1, Limit: 1})
	if err != nil {
		return err
	}
	if len(page.Events) == 1 && page.Events[0].ID == index {
		var committed T
		if err := json.Unmarshal(page.Events[0].Data, &committed); err == nil {
			return e.writeValue(w, &committed)
		}
	}
	return fmt.Errorf("%w: read back %s %q at revision %d: a later write replaced it", store.ErrConflict, e.param, key, index)
}

func (e entity[T]) deleteHandler(a *API) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		key, cond, err := e.target(r)
		if err != nil {
			return err
		}
		cmd, err := e.del(key, cond)
		if err != nil {
			return err
		}
		res, err := a.commit(r, cmd)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, Deleted{Deleted: key, Revision: res.GetIndex()})
		return nil
	}
}

// Deleted is the answer to a DELETE.
type Deleted struct {
	Deleted  string `json:"deleted"`
	Revision uint64 `json:"revision"`
}

// commit proposes cmd, turns a business failure into its error, and waits
// until the local replica has applied it, so the caller reads its own write
// from this node.
func (a *API) commit(r *http.Request, cmd *command.Command) (*commandv1.Result, error) {
	// The actor is checked here for a clear 400 (a certificate subject with
	// control characters); the leader checks the envelope again.
	if err := command.CheckActor(actor(r)); err != nil {
		return nil, badRequest(err.Error())
	}
	command.WithAudit(cmd, actor(r), requestID(r))
	res, err := a.b.Propose(r.Context(), cmd)
	if err != nil {
		return nil, err
	}
	if err := command.ResultErr(res); err != nil {
		return nil, err
	}
	return res, nil
}

// EmployeeList is GET /v1/employees.
type EmployeeList struct {
	Employees    []*policy.Employee `json:"employees"`
	AppliedIndex uint64             `json:"applied_index"`
}

func (a *API) listEmployees(w http.ResponseWriter, r *http.Request) error {
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	idx := a.b.Store().AppliedIndex()
	es, err := a.b.Store().ListEmployees(r.URL.Query().Get("org"), r.URL.Query().Get("team"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, EmployeeList{Employees: nonNil(es), AppliedIndex: idx})
	return nil
}

func (a *API) clusterStatus(w http.ResponseWriter, r *http.Request) error {
	st, err := a.b.Status(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// JoinRequest is POST /v1/cluster/join.
type JoinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
}

// Membership is the answer to a membership change.
type Membership struct {
	ID    string `json:"id"`
	Index uint64 `json:"index"`
}

func (a *API) clusterJoin(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req JoinRequest
	if err := policy.DecodeStrict(body, &req); err != nil {
		return err
	}
	if req.ID == "" || req.RaftAddr == "" {
		return badRequest("id and raft_addr are required")
	}
	idx, err := a.b.Join(r.Context(), req.ID, req.RaftAddr)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, Membership{ID: req.ID, Index: idx})
	return nil
}

func (a *API) clusterRemove(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	idx, err := a.b.Remove(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, Membership{ID: id, Index: idx})
	return nil
}
