package console

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/policyd/policyd/adminclient"
)

type driftData struct {
	Phase   string
	Reports []driftRow
}

// driftRow is a report with the parts of its DriftReport a reader wants.
type driftRow struct {
	adminclient.DriftReport
	Child, Parent, Controller, Operation string
	Trace                                []string
	Diff                                 []string
}

// driftReport is the part of a stored DriftReport the page shows
// (docs/drift.md).
type driftReport struct {
	Spec struct {
		Parent  objectRef `json:"parent"`
		Child   objectRef `json:"child"`
		Request struct {
			User      string `json:"user"`
			Operation string `json:"operation"`
		} `json:"request"`
		NewObject struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"newObject"`
		Diff []string `json:"diff"`
	} `json:"spec"`
}

type objectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (o objectRef) String() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}

func (c *Console) drift(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	phase := r.URL.Query().Get("phase")
	list, err := api.Drift(r.Context(), adminclient.DriftFilter{Phase: phase, Limit: 200})
	if err != nil {
		return "", "", nil, err
	}
	d := &driftData{Phase: phase}
	for _, rep := range list.Reports {
		row := driftRow{DriftReport: rep}
		var dr driftReport
		if json.Unmarshal(rep.Report, &dr) == nil {
			row.Child, row.Parent = dr.Spec.Child.String(), dr.Spec.Parent.String()
			row.Controller, row.Operation, row.Diff = dr.Spec.Request.User, dr.Spec.Request.Operation, dr.Spec.Diff
			for k, v := range dr.Spec.NewObject.Metadata.Annotations {
				if strings.HasSuffix(k, "/trace") {
					row.Trace = traceHops(v)
				}
			}
		}
		d.Reports = append(d.Reports, row)
	}
	return "drift", "Drift", d, nil
}

// traceHops renders the trace annotation's hops one per line; what does
// not parse is shown as it is.
func traceHops(v string) []string {
	var hops []map[string]any
	if err := json.Unmarshal([]byte(v), &hops); err != nil {
		return []string{v}
	}
	out := make([]string, 0, len(hops))
	for _, h := range hops {
		b, _ := json.Marshal(h) // it was just decoded from JSON
		out = append(out, string(b))
	}
	return out
}
