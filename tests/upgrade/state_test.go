//go:build linux

package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/poll"
)

// scope is a policy's scope as the REST API shows it.
type scope struct {
	Org      string `json:"org"`
	Team     string `json:"team"`
	Employee string `json:"employee"`
}

// policy is the REST API's policy, the fields both versions must agree on.
// Spec is decoded, so that a diff shows which field differs.
type policy struct {
	Name      string            `json:"name"`
	Kind      string            `json:"kind"`
	Scope     scope             `json:"scope"`
	Labels    map[string]string `json:"labels,omitempty"`
	Spec      any               `json:"spec"`
	Revision  uint64            `json:"revision"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
}

// employee is the REST API's employee.
type employee struct {
	ID        string    `json:"id"`
	Org       string    `json:"org"`
	Team      string    `json:"team"`
	Status    string    `json:"status"`
	Revision  uint64    `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// identities are whose policy-set versions are compared across nodes: an
// org, a team and an employee with policies of their own, and an org with
// only the global ones.
var identities = []scope{
	{Org: "acme"},
	{Org: "acme", Team: "sre"},
	{Org: "acme", Team: "sre", Employee: "alice"},
	{Org: "globex"},
}

// model is what the cluster acknowledged: every node must serve exactly it.
type model struct {
	policies  map[string]policy
	employees map[string]employee
}

func newModel() *model {
	return &model{policies: map[string]policy{}, employees: map[string]employee{}}
}

// errConflict is a 409: an If-Match that did not hold.
var errConflict = errors.New("409 conflict")

// write sends one write to nd and decodes a 200's body into out (if not
// nil). A 503 (no leader reachable, e.g. during an election) is retried
// for a while: such a write was not proposed.
func (c *cluster) write(nd *node, method, path string, body any, ifMatch *uint64, out any) error {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return err
		}
	}
	var hdr http.Header
	if ifMatch != nil {
		hdr = http.Header{"If-Match": {strconv.Quote(strconv.FormatUint(*ifMatch, 10))}}
	}
	var err error
	_ = poll.Until(context.Background(), 20*time.Second, poll.Holds(func() bool {
		err = nd.api.Do(c.ctx, method, path, hdr, raw, out)
		var ae *adminclient.Error
		return !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable
	}))

	var ae *adminclient.Error
	switch {
	case errors.As(err, &ae) && ae.Status == http.StatusConflict:
		return fmt.Errorf("%s: %s %s: %w: %s", nd.id, method, path, errConflict, ae.Message)
	case err != nil:
		return fmt.Errorf("%s: %s %s: %w", nd.id, method, path, err)
	}
	return nil
}

// putPolicy writes p through nd, checks that the stored policy is the one
// sent, and records it.
func (m *model) putPolicy(c *cluster, nd *node, p policy, ifMatch *uint64) error {
	var got policy
	if err := c.write(nd, http.MethodPut, "/v1/policies/"+p.Name, p, ifMatch, &got); err != nil {
		return err
	}
	sent := roundTrip(p)
	sent.Revision, sent.CreatedAt, sent.UpdatedAt = got.Revision, got.CreatedAt, got.UpdatedAt
	if diff := cmp.Diff(sent, got); diff != "" {
		return fmt.Errorf("%s: PUT policy %s stored something else (-sent +stored):\n%s", nd.id, p.Name, diff)
	}
	if prev, ok := m.policies[p.Name]; ok && got.Revision <= prev.Revision {
		return fmt.Errorf("%s: PUT policy %s: revision %d after %d", nd.id, p.Name, got.Revision, prev.Revision)
	}
	m.policies[p.Name] = got
	return nil
}

// roundTrip gives p's spec the types JSON decoding gives it, as the
// served policy's spec has them.
func roundTrip(p policy) policy {
	b, err := json.Marshal(p.Spec)
	if err == nil {
		_ = json.Unmarshal(b, &p.Spec)
	}
	return p
}

func (m *model) deletePolicy(c *cluster, nd *node, name string, ifMatch *uint64) error {
	if err := c.write(nd, http.MethodDelete, "/v1/policies/"+name, nil, ifMatch, nil); err != nil {
		return err
	}
	delete(m.policies, name)
	return nil
}

func (m *model) putEmployee(c *cluster, nd *node, e employee, ifMatch *uint64) error {
	var got employee
	if err := c.write(nd, http.MethodPut, "/v1/employees/"+e.ID, e, ifMatch, &got); err != nil {
		return err
	}
	if got.ID != e.ID || got.Org != e.Org || got.Team != e.Team || got.Status != e.Status {
		return fmt.Errorf("%s: PUT employee %s stored %+v, sent %+v", nd.id, e.ID, got, e)
	}
	m.employees[e.ID] = got
	return nil
}

func (m *model) deleteEmployee(c *cluster, nd *node, id string) error {
	if err := c.write(nd, http.MethodDelete, "/v1/employees/"+id, nil, nil, nil); err != nil {
		return err
	}
	delete(m.employees, id)
	return nil
}

// writeRound makes one of each kind of write through nd, named after tag:
// policies of every kind and scope, compare-and-set updates and deletes
// (one refused with a stale If-Match), employee changes and deletes.
func (m *model) writeRound(c *cluster, nd *node, tag string) error {
	tool := policy{
		Name: tag + "-tool", Kind: "ToolPolicy", Scope: scope{Org: "acme", Team: "sre"},
		Labels: map[string]string{"round": tag},
		Spec: map[string]any{"tool_name": "Bash", "action": "deny", "reason": "no shell in " + tag,
			"conditions": map[string]any{"patterns": []any{"rm -rf", "^curl .*\\| *sh$"}}},
	}
	cel := policy{
		Name: tag + "-cel", Kind: "ValidatingPolicy", Scope: scope{Org: "acme"},
		Spec: map[string]any{"validations": []any{map[string]any{
			"expression": "object.spec.replicas <= 5", "message": "at most 5 replicas (" + tag + ")"}}},
	}
	extra := policy{
		Name: tag + "-limit", Kind: extraKind, Spec: map[string]any{"requests_per_minute": 60.0, "round": tag},
	}
	mine := policy{
		Name: tag + "-alice", Kind: "ToolPolicy", Scope: scope{Org: "acme", Employee: "alice"},
		Spec: map[string]any{"tool_name": "WebFetch", "action": "audit"},
	}
	none := uint64(0) // If-Match 0: must not exist yet
	for _, step := range []func() error{
		func() error { return m.putPolicy(c, nd, tool, nil) },
		func() error { return m.putPolicy(c, nd, cel, &none) },
		func() error { return m.putPolicy(c, nd, extra, nil) },
		func() error { return m.putPolicy(c, nd, mine, nil) },
		func() error {
			rev := m.policies[tool.Name].Revision
			tool.Spec.(map[string]any)["action"] = "audit"
			if err := m.putPolicy(c, nd, tool, &rev); err != nil {
				return err
			}
			// rev is now stale: the write must be refused and change nothing.
			tool.Spec.(map[string]any)["action"] = "allow"
			return wantConflict(m.putPolicy(c, nd, tool, &rev))
		},
		func() error { return wantConflict(m.putPolicy(c, nd, cel, &none)) },
		func() error {
			stale := m.policies[extra.Name].Revision - 1
			if err := wantConflict(m.deletePolicy(c, nd, extra.Name, &stale)); err != nil {
				return err
			}
			rev := m.policies[extra.Name].Revision
			return m.deletePolicy(c, nd, extra.Name, &rev)
		},
		func() error {
			return m.putEmployee(c, nd, employee{ID: tag + "-emp", Org: "acme", Team: "sre", Status: "active"}, nil)
		},
		func() error {
			rev := m.employees[tag+"-emp"].Revision
			return m.putEmployee(c, nd, employee{ID: tag + "-emp", Org: "acme", Team: "ops", Status: "inactive"}, &rev)
		},
		func() error {
			return m.putEmployee(c, nd, employee{ID: tag + "-gone", Org: "globex", Team: "web", Status: "active"}, nil)
		},
		func() error { return m.deleteEmployee(c, nd, tag+"-gone") },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("round %s: %w", tag, err)
		}
	}
	return nil
}

// wantConflict turns the expected 409 into nil, and anything else into an
// error.
func wantConflict(err error) error {
	if errors.Is(err, errConflict) {
		return nil
	}
	if err == nil {
		return errors.New("a write with a stale If-Match was accepted")
	}
	return fmt.Errorf("want 409 for a stale If-Match: %w", err)
}

// policyList and employeeList are GET /v1/policies and /v1/employees.
type policyList struct {
	Policies []policy `json:"policies"`
	Version  string   `json:"version"`
}

type employeeList struct {
	Employees []employee `json:"employees"`
}

// policySet is what one node serves an identity: its policy-set version
// and which revisions it holds.
type policySet struct {
	Version   string
	Revisions map[string]uint64
}

// checkConverged waits until every node serves the model's policies and
// employees and the same policy-set versions, and fails the test with the
// difference if that does not happen in time.
func (c *cluster) checkConverged(m *model, when string) {
	c.t.Helper()
	var last error
	if poll.Until(context.Background(), 30*time.Second, poll.Holds(func() bool {
		last = c.converged(m)
		return last == nil || errors.Is(last, errExited)
	})) !=
		nil ||
		last != nil {
		c.t.Fatalf("%s: nodes do not serve the acknowledged state: %v", when, last)
	}
}

func (c *cluster) converged(m *model) error {
	if err := c.exited(); err != nil {
		return err
	}
	var ref []policySet
	for _, nd := range c.nodes {
		var pl policyList
		if err := c.get(nd, "/v1/policies", &pl); err != nil {
			return err
		}
		got := map[string]policy{}
		for _, p := range pl.Policies {
			got[p.Name] = p
		}
		if diff := cmp.Diff(m.policies, got); diff != "" {
			return fmt.Errorf("%s (%s): policies (-acknowledged +served):\n%s", nd.id, nd.bin, diff)
		}
		var el employeeList
		if err := c.get(nd, "/v1/employees", &el); err != nil {
			return err
		}
		gotEmp := map[string]employee{}
		for _, e := range el.Employees {
			gotEmp[e.ID] = e
		}
		if diff := cmp.Diff(m.employees, gotEmp); diff != "" {
			return fmt.Errorf("%s (%s): employees (-acknowledged +served):\n%s", nd.id, nd.bin, diff)
		}
		var sets []policySet
		for _, id := range identities {
			q := url.Values{"org": {id.Org}}
			if id.Team != "" {
				q.Set("team", id.Team)
			}
			if id.Employee != "" {
				q.Set("employee", id.Employee)
			}
			var set policyList
			if err := c.get(nd, "/v1/policies?"+q.Encode(), &set); err != nil {
				return err
			}
			if set.Version == "" {
				return fmt.Errorf("%s: no policy-set version for %+v", nd.id, id)
			}
			ps := policySet{Version: set.Version, Revisions: map[string]uint64{}}
			for _, p := range set.Policies {
				ps.Revisions[p.Name] = p.Revision
			}
			sets = append(sets, ps)
		}
		if ref == nil {
			ref = sets
		} else if diff := cmp.Diff(ref, sets); diff != "" {
			return fmt.Errorf("%s (%s): policy sets of %v differ from %s's (-%s +%s):\n%s",
				nd.id, nd.bin, identities, c.nodes[0].id, c.nodes[0].id, nd.id, diff)
		}
	}
	return nil
}
