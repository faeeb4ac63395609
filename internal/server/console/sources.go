package console

import (
	"net/http"

	"github.com/policyd/policyd/adminclient"
)

func (c *Console) sources(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	v, err := api.Sources(r.Context())
	if err != nil {
		return "", "", nil, err
	}
	return "sources", "Sources", v, nil
}
