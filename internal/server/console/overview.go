package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/policyd/policyd/adminclient"
)

// staleAfter is when a sidecar's silence needs attention.
const staleAfter = 30 * time.Second

// overviewData is the Overview's body, rendered by the page and by its
// live view alike.
type overviewData struct {
	Cluster   *adminclient.ClusterStatus
	Members   []memberRow
	Sidecars  *adminclient.ClientList
	Attention []attention
	// Problems are the parts that could not be read, shown as such.
	Problems []string
	At       time.Time
}

type memberRow struct {
	adminclient.Member
	Ready   bool
	Reason  string
	Applied uint64
}

// attention is one "needs attention" item, linking to its page.
type attention struct {
	What, Detail, Link string
}

func (c *Console) overview(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	return "overview", "Overview", c.overviewData(r.Context(), api), nil
}

// overviewData reads every part at once; a part that fails is a problem
// on the page, not an error page, so a cluster in trouble still shows
// what it can.
func (c *Console) overviewData(ctx context.Context, api *adminclient.Client) *overviewData {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	d := &overviewData{At: time.Now()}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		problem = func(part string, err error) {
			mu.Lock()
			d.Problems = append(d.Problems, part+": "+err.Error())
			mu.Unlock()
		}
		add      = func(a attention) { mu.Lock(); d.Attention = append(d.Attention, a); mu.Unlock() }
		rollouts *adminclient.StagedRolloutList
		drift    *adminclient.DriftList
		srcs     *adminclient.SourceList
		rel      *adminclient.ReloadView
	)
	run := func(part string, fn func() error) {
		wg.Go(func() {
			if err := fn(); err != nil {
				problem(part, err)
			}
		})
	}
	run("cluster", func() (err error) { d.Cluster, err = api.Cluster(ctx); return })
	run("sidecars", func() (err error) {
		// One row: the counts are what the Overview shows.
		d.Sidecars, err = api.ClientsPage(ctx, adminclient.ClientFilter{StaleAfter: staleAfter, Limit: 1})
		return
	})
	run("rollouts", func() (err error) { rollouts, err = api.StagedRollouts(ctx, "active"); return })
	run("drift", func() (err error) {
		drift, err = api.Drift(ctx, adminclient.DriftFilter{Phase: "Detected", Limit: 200})
		return
	})
	run("sources", func() (err error) { srcs, err = api.Sources(ctx); return })
	run("reload", func() (err error) { rel, err = api.Reload(ctx); return })
	wg.Wait()

	if d.Cluster != nil {
		d.Members = c.probeMembers(ctx, d.Cluster.Members)
		for _, m := range d.Members {
			if !m.Ready {
				add(attention{What: "Node " + m.ID + " is not ready", Detail: m.Reason, Link: "/ui/#members"})
			}
		}
		if d.Cluster.LeaderID == "" {
			add(attention{What: "No leader", Detail: "this node knows no leader; writes wait for an election", Link: "/ui/#members"})
		}
	}
	if s := d.Sidecars; s != nil {
		if n := s.Counts.Nacked; n > 0 {
			add(attention{What: plural(n, "sidecar") + " NACKed", Detail: "they keep their last good version", Link: "/ui/sidecars?state=nacked"})
		}
		if n := s.Counts.Stale; n > 0 {
			add(attention{What: plural(n, "sidecar") + " silent for more than 30s", Detail: "no health check since", Link: "/ui/sidecars?state=stale"})
		}
		if len(s.Unreachable) > 0 {
			add(attention{What: "Sidecar lists incomplete", Detail: "no answer from " + fmt.Sprint(s.Unreachable), Link: "/ui/sidecars"})
		}
	}
	if rollouts != nil {
		for _, ro := range rollouts.Rollouts {
			if ro.State == "halted" || ro.State == "paused" {
				detail := ro.HaltReason
				if detail == "" {
					detail = "stage " + fmt.Sprint(ro.Stage+1) + " of " + fmt.Sprint(len(ro.Stages))
				}
				add(attention{What: "Rollout " + ro.ID + " is " + ro.State, Detail: detail, Link: "/ui/rollouts/" + url.PathEscape(ro.ID)})
			}
		}
	}
	if drift != nil {
		n := 0
		for _, rep := range drift.Reports {
			if time.Since(rep.LastSeen) < time.Hour {
				n++
			}
		}
		if n > 0 {
			add(attention{What: plural(n, "drift report") + " in the last hour", Detail: "controllers changed objects their parents did not", Link: "/ui/drift?phase=Detected"})
		}
	}
	if srcs != nil {
		for _, s := range srcs.Sources {
			if rec := s.Reconciler; rec != nil && (rec.LastError != "" || len(rec.Invalid) > 0 || len(rec.Conflicts) > 0 || rec.PruneRefused != nil) {
				detail := rec.LastError
				if detail == "" {
					detail = fmt.Sprintf("%d invalid, %d in conflict", len(rec.Invalid), len(rec.Conflicts))
				}
				add(attention{What: "Source " + s.Name + " needs attention", Detail: detail, Link: "/ui/sources#" + s.Name})
			}
		}
	}
	if rel != nil {
		if rel.Controller.State == "stopped" {
			add(attention{What: "Reload controller stopped", Detail: rel.Controller.Reason, Link: "/ui/reload"})
		}
		if n := len(rel.Errors); n > 0 {
			add(attention{What: plural(n, "restart") + " failing", Detail: rel.Errors[0].Error, Link: "/ui/reload"})
		}
	}
	return d
}

// probeMembers asks every member whether it is ready, at once.
func (c *Console) probeMembers(ctx context.Context, members []adminclient.Member) []memberRow {
	rows := make([]memberRow, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		rows[i] = memberRow{Member: m, Ready: true}
		if c.cfg.Probe == nil {
			continue
		}
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			applied, err := c.cfg.Probe(pctx, m.HTTPAddr)
			rows[i].Applied = applied
			if err != nil {
				rows[i].Ready, rows[i].Reason = false, err.Error()
			}
		})
	}
	wg.Wait()
	return rows
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
