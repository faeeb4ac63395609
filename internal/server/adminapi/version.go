package adminapi

import (
	"net/http"

	"github.com/policyd/policyd/internal/buildinfo"
)

// version answers GET /v1/version: the build of the serving node.
func (a *API) version(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, buildinfo.Read())
	return nil
}
