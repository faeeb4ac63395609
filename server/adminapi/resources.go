package adminapi

import (
	"fmt"
	"net/http"
	"strconv"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/raftfsm"
	"github.com/policyd/policyd/store"
)

// PolicyList is GET /v1/policies.
type PolicyList struct {
	Policies []*policy.Policy `json:"policies"`
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

func (a *API) listPolicies(w http.ResponseWriter, r *http.Request) error {
	id, err := identityFilter(r)
	if err != nil {
		return err
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	idx := a.b.Store().AppliedIndex()
	ps, err := a.b.Store().ListPolicies(store.PolicyFilter{Identity: id, Kind: r.URL.Query().Get("kind")})
	if err != nil {
		return err
	}
	if ps == nil {
		ps = []*policy.Policy{}
	}
	writeJSON(w, http.StatusOK, PolicyList{Policies: ps, AppliedIndex: idx})
	return nil
}

func (a *API) getPolicy(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := policy.ValidPolicyName(name); err != nil {
		return err
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	return a.writePolicy(w, name)
}

func (a *API) putPolicy(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := policy.ValidPolicyName(name); err != nil {
		return err
	}
	cond, err := ifMatch(r)
	if err != nil {
		return err
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	p, err := policy.DecodePolicy(body)
	if err != nil {
		return err
	}
	if p.Name == "" {
		p.Name = name
	}
	if p.Name != name {
		return badRequest(fmt.Sprintf("name: %q does not match the path's %q", p.Name, name))
	}
	if err := a.b.Validator().Policy(p); err != nil {
		return err
	}
	cmd, err := raftfsm.PutPolicy(p, cond)
	if err != nil {
		return err
	}
	if _, err := a.commit(r, cmd); err != nil {
		return err
	}
	return a.writePolicy(w, name)
}

// writePolicy answers with the local replica's copy and its revision as ETag.
func (a *API) writePolicy(w http.ResponseWriter, name string) error {
	p, err := a.b.Store().GetPolicy(name)
	if err != nil {
		return err
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(p.Revision, 10)))
	writeJSON(w, http.StatusOK, p)
	return nil
}

// Deleted is the answer to a DELETE.
type Deleted struct {
	Deleted  string `json:"deleted"`
	Revision uint64 `json:"revision"`
}

func (a *API) deletePolicy(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := policy.ValidPolicyName(name); err != nil {
		return err
	}
	cond, err := ifMatch(r)
	if err != nil {
		return err
	}
	cmd, err := raftfsm.DeletePolicy(name, cond)
	if err != nil {
		return err
	}
	res, err := a.commit(r, cmd)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, Deleted{Deleted: name, Revision: res.GetIndex()})
	return nil
}

// commit proposes cmd, turns a business failure into its error, and waits
// until the local replica has applied it, so the caller reads its own write
// from this node.
func (a *API) commit(r *http.Request, cmd *commandv1.Command) (*commandv1.Result, error) {
	res, err := a.b.Propose(r.Context(), cmd)
	if err != nil {
		return nil, err
	}
	if err := raftfsm.ResultErr(res); err != nil {
		return nil, err
	}
	if err := a.b.Store().WaitApplied(r.Context(), res.GetIndex()); err != nil {
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
	if es == nil {
		es = []*policy.Employee{}
	}
	writeJSON(w, http.StatusOK, EmployeeList{Employees: es, AppliedIndex: idx})
	return nil
}

func (a *API) getEmployee(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := policy.ValidEmployeeID(id); err != nil {
		return err
	}
	if err := a.maybeConsistent(r); err != nil {
		return err
	}
	return a.writeEmployee(w, id)
}

func (a *API) writeEmployee(w http.ResponseWriter, id string) error {
	e, err := a.b.Store().GetEmployee(id)
	if err != nil {
		return err
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(e.Revision, 10)))
	writeJSON(w, http.StatusOK, e)
	return nil
}

func (a *API) putEmployee(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := policy.ValidEmployeeID(id); err != nil {
		return err
	}
	cond, err := ifMatch(r)
	if err != nil {
		return err
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	e, err := policy.DecodeEmployee(body)
	if err != nil {
		return err
	}
	if e.ID == "" {
		e.ID = id
	}
	if e.ID != id {
		return badRequest(fmt.Sprintf("id: %q does not match the path's %q", e.ID, id))
	}
	if err := a.b.Validator().Employee(e); err != nil {
		return err
	}
	cmd, err := raftfsm.PutEmployee(e, cond)
	if err != nil {
		return err
	}
	if _, err := a.commit(r, cmd); err != nil {
		return err
	}
	return a.writeEmployee(w, id)
}

func (a *API) deleteEmployee(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := policy.ValidEmployeeID(id); err != nil {
		return err
	}
	cond, err := ifMatch(r)
	if err != nil {
		return err
	}
	cmd, err := raftfsm.DeleteEmployee(id, cond)
	if err != nil {
		return err
	}
	res, err := a.commit(r, cmd)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, Deleted{Deleted: id, Revision: res.GetIndex()})
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
