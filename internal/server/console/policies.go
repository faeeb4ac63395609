package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/pmezard/go-difflib/difflib"

	"github.com/policyd/policyd/adminclient"
)

// policiesPerPage bounds the Policies list.
const policiesPerPage = 100

type policiesData struct {
	Policies []adminclient.Policy
	Filter   policyFilter
	Total    int
	Page     int
	Pages    int
	Prev     string
	Next     string
	// Kinds and Sources offer the values present, for the filter's lists.
	Kinds, Sources []string
}

// policyFilter is the list's filter: exact scope fields, kind, source
// ("api" for the API's own) and one label (key or key=value).
type policyFilter struct {
	Org, Team, Kind, Source, Label string
}

func (f policyFilter) match(p adminclient.Policy) bool {
	if f.Org != "" && p.Scope.Org != f.Org || f.Team != "" && p.Scope.Team != f.Team || f.Kind != "" && p.Kind != f.Kind {
		return false
	}
	if src := p.Source; f.Source != "" && src != f.Source && (f.Source != "api" || src != "") {
		return false
	}
	if f.Label != "" {
		k, v, hasValue := strings.Cut(f.Label, "=")
		got, ok := p.Labels[k]
		if !ok || hasValue && got != v {
			return false
		}
	}
	return true
}

func (f policyFilter) query(page int) string {
	return pageLink("/ui/policies", map[string]string{"org": f.Org, "team": f.Team, "kind": f.Kind, "source": f.Source, "label": f.Label}, page)
}

// pageLink is path with the filters that are set and, past the first, the
// page number.
func pageLink(path string, filters map[string]string, page int) string {
	v := url.Values{}
	for k, s := range filters {
		if s != "" {
			v.Set(k, s)
		}
	}
	if page > 1 {
		v.Set("page", strconv.Itoa(page))
	}
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}

func pageParam(r *http.Request) (int, error) {
	p := r.URL.Query().Get("page")
	if p == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 1_000_000 {
		return 0, badRequestf("page %q is not a page number", p)
	}
	return n, nil
}

func (c *Console) policies(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	q := r.URL.Query()
	f := policyFilter{Org: q.Get("org"), Team: q.Get("team"), Kind: q.Get("kind"), Source: q.Get("source"), Label: q.Get("label")}
	page, err := pageParam(r)
	if err != nil {
		return "", "", nil, err
	}
	list, err := api.Policies(r.Context(), adminclient.PolicyFilter{Summary: true})
	if err != nil {
		return "", "", nil, err
	}
	d := &policiesData{Filter: f, Page: page}
	kinds, srcs := map[string]bool{}, map[string]bool{"api": true}
	for _, p := range list.Policies {
		kinds[p.Kind] = true
		if p.Source != "" {
			srcs[p.Source] = true
		}
		if f.match(p) {
			d.Policies = append(d.Policies, p)
		}
	}
	d.Kinds, d.Sources = sortedKeys(kinds), sortedKeys(srcs)
	d.Total = len(d.Policies)
	d.Pages = max(1, (d.Total+policiesPerPage-1)/policiesPerPage)
	lo := min((page-1)*policiesPerPage, d.Total)
	d.Policies = d.Policies[lo:min(lo+policiesPerPage, d.Total)]
	if page > 1 {
		d.Prev = f.query(page - 1)
	}
	if page < d.Pages {
		d.Next = f.query(page + 1)
	}
	return "policies", "Policies", d, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

type policyData struct {
	Policy  *adminclient.Policy
	Spec    string
	History *adminclient.History
	// Diff is between revisions From and To, when asked for.
	Diff     []diffLine
	From, To uint64
	Shadow   *adminclient.ShadowView
	// Holding counts the sidecars in the policy's scope by state: acked
	// ones hold the policy, once their set's version holds it.
	Holding *adminclient.ClientList
	// Problems are parts that could not be read.
	Problems []string
}

// diffLine is one line of a unified diff; Op is "+", "-", "@" or " ".
type diffLine struct {
	Op, Text string
}

func (c *Console) policy(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	name := r.PathValue("name")
	ctx := r.Context()
	p, err := api.Policy(ctx, name)
	if err != nil {
		return "", "", nil, err
	}
	d := &policyData{Policy: p, Spec: indent(p.Spec)}
	if d.History, err = api.History(ctx, "policies", name, false); err != nil {
		d.Problems = append(d.Problems, "history: "+err.Error())
	}
	q := r.URL.Query()
	if q.Get("from") != "" || q.Get("to") != "" {
		if d.From, err = revParam(q.Get("from")); err != nil {
			return "", "", nil, err
		}
		d.To = p.Revision
		if q.Get("to") != "" {
			if d.To, err = revParam(q.Get("to")); err != nil {
				return "", "", nil, err
			}
		}
		if d.Diff, err = c.diff(r, api, name, d.From, d.To); err != nil {
			return "", "", nil, err
		}
	}
	if p.Enforcement == "shadow" {
		if d.Shadow, err = api.PolicyShadow(ctx, name); err != nil {
			d.Problems = append(d.Problems, "shadow counts: "+err.Error())
		}
	}
	if d.Holding, err = api.ClientsPage(ctx, adminclient.ClientFilter{Org: p.Scope.Org, Team: p.Scope.Team,
		Employee: p.Scope.Employee, StaleAfter: staleAfter, Limit: 1}); err != nil {
		d.Problems = append(d.Problems, "sidecars: "+err.Error())
	}
	return "policy", name, d, nil
}

func revParam(s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, badRequestf("revision %q is not a revision number", s)
	}
	return n, nil
}

// diff is the unified diff of two revisions' documents, indented.
func (c *Console) diff(r *http.Request, api *adminclient.Client, name string, from, to uint64) ([]diffLine, error) {
	a, err := api.Document(r.Context(), "policies", name, from, false)
	if err != nil {
		return nil, fmt.Errorf("revision %d: %w", from, err)
	}
	b, err := api.Document(r.Context(), "policies", name, to, false)
	if err != nil {
		return nil, fmt.Errorf("revision %d: %w", to, err)
	}
	text, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: difflib.SplitLines(content(a) + "\n"), B: difflib.SplitLines(content(b) + "\n"),
		FromFile: fmt.Sprintf("revision %d", from), ToFile: fmt.Sprintf("revision %d", to), Context: 3,
	})
	if err != nil {
		return nil, fmt.Errorf("diff: %w", err)
	}
	var out []diffLine
	for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if l == "" {
			continue
		}
		op := l[:1]
		if op != "+" && op != "-" && op != "@" {
			op = " "
		}
		out = append(out, diffLine{Op: op, Text: l})
	}
	return out, nil
}

// indent pretty-prints JSON for reading, with <, > and & as they are (the
// template escapes them); what does not parse is shown as it is.
func indent(raw json.RawMessage) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	return pretty(v)
}

func pretty(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Sprint(v)
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// content is a revision's document without what every write changes
// (revision, timestamps), so a diff shows what the change was.
func content(raw json.RawMessage) string {
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return string(raw)
	}
	delete(doc, "revision")
	delete(doc, "created_at")
	delete(doc, "updated_at")
	return pretty(doc)
}

type revertData struct {
	Name    string
	To      uint64
	Current uint64
	Diff    []diffLine
}

func (c *Console) revertConfirm(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	name := r.PathValue("name")
	to, err := revParam(r.URL.Query().Get("to"))
	if err != nil {
		return "", "", nil, err
	}
	p, err := api.Policy(r.Context(), name)
	if err != nil {
		return "", "", nil, err
	}
	d := &revertData{Name: name, To: to, Current: p.Revision}
	if d.Diff, err = c.diff(r, api, name, p.Revision, to); err != nil {
		return "", "", nil, err
	}
	return "revert", "Revert " + name, d, nil
}

func (c *Console) revert(r *http.Request, s *session, api *adminclient.Client) (string, error) {
	name := r.PathValue("name")
	to, err := revParam(r.PostFormValue("to"))
	if err != nil {
		return "", err
	}
	req := adminclient.RevertRequest{To: to}
	if v := r.PostFormValue("if_match"); v != "" {
		rev, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return "", badRequestf("if_match %q is not a revision number", v)
		}
		req.IfMatch = &rev
	}
	w, err := api.Revert(r.Context(), "policies", name, req)
	if err != nil {
		return "", err
	}
	return "/ui/policies/" + url.PathEscape(name) + "?" + s.flash(fmt.Sprintf("Reverted to revision %d: now revision %d.", to, w.Revision)), nil
}
