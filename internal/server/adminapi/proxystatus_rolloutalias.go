package adminapi

import "net/http"

// deprecatedRollout is GET /v1/rollout, the proxy-status view's name
// before "rollout" came to mean staged rollouts only. It answers as
// /v1/proxy-status does and logs its deprecation once per process.
func (a *API) deprecatedRollout(w http.ResponseWriter, r *http.Request) error {
	a.rolloutAlias.Do(func() {
		a.logger.Warn("GET /v1/rollout is deprecated and will be removed in the next release; use GET /v1/proxy-status",
			"user_agent", r.UserAgent())
	})
	return a.proxyStatus(w, r)
}
