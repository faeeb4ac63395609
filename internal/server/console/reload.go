package console

import (
	"net/http"

	"github.com/policyd/policyd/adminclient"
)

func (c *Console) reload(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	v, err := api.Reload(r.Context())
	if err != nil {
		return "", "", nil, err
	}
	return "reload", "Reload", v, nil
}
