package adminapi

import (
	"net/http"
	"net/http/pprof"

	"github.com/policyd/policyd/internal/auth"
)

// routePprof serves the Go runtime profiles (net/http/pprof) under
// /debug/pprof/, to the admin role only: a CPU profile or trace costs CPU
// for its whole duration, and heap and goroutine dumps show internals. It
// is how write-path profiles are taken (see bench/ and
// docs/performance.md); /debug/pprof/heap?gc=1 also forces a GC.
func (a *API) routePprof() {
	wrap := func(h http.HandlerFunc) handlerFunc {
		return func(w http.ResponseWriter, r *http.Request) error {
			h(w, r)
			return nil
		}
	}
	a.route("GET /debug/pprof/", auth.RoleAdmin, wrap(pprof.Index))
	a.route("GET /debug/pprof/cmdline", auth.RoleAdmin, wrap(pprof.Cmdline))
	a.route("GET /debug/pprof/profile", auth.RoleAdmin, wrap(pprof.Profile))
	a.route("GET /debug/pprof/symbol", auth.RoleAdmin, wrap(pprof.Symbol))
	a.route("GET /debug/pprof/trace", auth.RoleAdmin, wrap(pprof.Trace))
}
