package console

import (
	"net/http"

	"github.com/policyd/policyd/adminclient"
)

// sidecarsPerPage bounds a Sidecars page: the API pages on the server, so a
// fleet of 20,000 costs one page of rows.
const sidecarsPerPage = 50

type sidecarsData struct {
	List   *adminclient.ClientList
	Filter adminclient.ClientFilter
	Page   int
	Pages  int
	// States are the state tabs with their counts.
	States []stateTab
	Prev   string
	Next   string
}

type stateTab struct {
	Name, Label, Link string
	Count             int
	Current           bool
}

func (c *Console) sidecars(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	q := r.URL.Query()
	f := adminclient.ClientFilter{Node: q.Get("node"), Org: q.Get("org"), Team: q.Get("team"), State: q.Get("state"),
		StaleAfter: staleAfter, Limit: sidecarsPerPage}
	page, err := pageParam(r)
	if err != nil {
		return "", "", nil, err
	}
	f.Offset = (page - 1) * sidecarsPerPage
	list, err := api.ClientsPage(r.Context(), f)
	if err != nil {
		return "", "", nil, err
	}
	d := &sidecarsData{List: list, Filter: f, Page: page, Pages: max(1, (list.Total+sidecarsPerPage-1)/sidecarsPerPage)}
	link := func(state string, page int) string {
		return pageLink("/ui/sidecars", map[string]string{"node": f.Node, "org": f.Org, "team": f.Team, "state": state}, page)
	}
	all := list.Counts.Pending + list.Counts.Acked + list.Counts.Nacked
	d.States = []stateTab{
		{Name: "", Label: "All", Count: all},
		{Name: "acked", Label: "ACKed", Count: list.Counts.Acked},
		{Name: "pending", Label: "Pending", Count: list.Counts.Pending},
		{Name: "nacked", Label: "NACKed", Count: list.Counts.Nacked},
		{Name: "stale", Label: "Silent > 30s", Count: list.Counts.Stale},
	}
	for i := range d.States {
		d.States[i].Link = link(d.States[i].Name, 1)
		d.States[i].Current = d.States[i].Name == f.State
	}
	if page > 1 {
		d.Prev = link(f.State, page-1)
	}
	if page < d.Pages {
		d.Next = link(f.State, page+1)
	}
	return "sidecars", "Sidecars", d, nil
}
