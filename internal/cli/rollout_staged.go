package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// Staged rollouts (docs/rollouts.md): policyd rollout start, status, pause,
// resume, promote and abort, beside the plain "policyd rollout" ACK view
// (rollout.go; its handler, rolloutAlias, is in proxystatus_rolloutalias.go).

// errRolloutFailed fails status --wait when a rollout ended halted, rolled
// back or aborted.
var errRolloutFailed = errors.New("rollout did not complete")

// rolloutWaitPoll is how often status --wait reads the rollout again.
const rolloutWaitPoll = time.Second

func stagedRolloutCommands(c *adminClient) []*cobra.Command {
	cmds := []*cobra.Command{rolloutStartCommand(c), rolloutStatusCommand(c)}
	for _, a := range []struct{ action, short string }{
		{adminclient.RolloutPause, "Pause a running rollout: its cohort keeps the candidate, nothing moves"},
		{adminclient.RolloutResume, "Resume a paused or halted rollout; its stage's bake time starts again"},
		{adminclient.RolloutPromote, "Complete a rollout now: its changes become ordinary policy revisions"},
		{adminclient.RolloutAbort, "Abort a rollout: its cohort gets the stable set back"},
	} {
		cmds = append(cmds, &cobra.Command{
			Use: a.action + " ID", Short: a.short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				api, err := c.client()
				if err != nil {
					return err
				}
				ro, err := api.RolloutAction(cmd.Context(), args[0], a.action)
				if err != nil {
					return err
				}
				return c.print(cmd, ro, rolloutTable([]adminclient.StagedRollout{*ro}))
			},
		})
	}
	return cmds
}

func rolloutStartCommand(c *adminClient) *cobra.Command {
	var (
		file, stages, onHalt string
		bake                 time.Duration
		maxNack, minCov      float64
		maxImpact            float64
		impactSince          string
	)
	cmd := &cobra.Command{
		Use:   "start -f CHANGES --stages 5%,25%,100% --bake 2m",
		Short: "Start a staged rollout of policy changes",
		Long: `start stages the changes in CHANGES (YAML or JSON, - for stdin): a stream
of policy documents, each a put, and {delete: NAME} documents. The sidecars
of each stage's share receive the changes first; a stage passes once its
bake time is over, its ACK coverage is at least --min-ack-coverage and its
NACK ratio within --max-nack-ratio; a NACK ratio above it halts the
rollout (--on-halt rollback: the cohort gets the stable set back; stay:
it keeps the candidate until resumed or aborted). The last stage (100%)
makes the changes ordinary policy revisions.

A stage may set its own bake time: --stages 5%:10m,50%,100%:1h.

--max-impact R replays the decisions logged since --impact-since under the
changes first (policy impact) and refuses to start, with 409 and the counts,
when more than R of them would flip from allow to deny.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return &usageError{errors.New("-f CHANGES is required")}
			}
			st, err := parseStages(stages, bake)
			if err != nil {
				return &usageError{err}
			}
			changes, err := readChanges(file)
			if err != nil {
				return err
			}
			req := adminclient.StartRollout{Changes: changes, Stages: st, MaxNackRatio: maxNack, OnHalt: onHalt}
			if cmd.Flags().Changed("min-ack-coverage") {
				req.MinAckCoverage = &minCov
			}
			if cmd.Flags().Changed("max-impact") {
				req.MaxImpactRatio, req.ImpactSince = &maxImpact, impactSince
			}
			api, err := c.client()
			if err != nil {
				return err
			}
			ro, err := api.StartRollout(cmd.Context(), req)
			if err != nil {
				return err
			}
			return c.print(cmd, ro, rolloutTable([]adminclient.StagedRollout{*ro}))
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the changes: policy documents (puts) and {delete: NAME} documents, YAML or JSON; - for stdin")
	f.StringVar(&stages, "stages", "100%", "the stages' percentages, increasing, the last 100%; PERCENT:BAKE sets one stage's bake time")
	f.DurationVar(&bake, "bake", 5*time.Minute, "each stage's bake time (1s to 24h) where --stages sets none")
	f.Float64Var(&maxNack, "max-nack-ratio", 0, "halt when NACKs exceed this share of a stage's cohort (0..1)")
	f.Float64Var(&minCov, "min-ack-coverage", 1, "a stage passes only when this share of its cohort has ACKed (0..1)")
	f.StringVar(&onHalt, "on-halt", "rollback", "on a halt: rollback, or stay (keep the candidate until resumed or aborted)")
	f.Float64Var(&maxImpact, "max-impact", 0, "first replay the logged decisions, and refuse to start when more than this share flips from allow to deny (0..1; see policy impact)")
	f.StringVar(&impactSince, "impact-since", "24h", "with --max-impact: replay the decisions logged since")
	return cmd
}

// parseStages reads "5%,25%:10m,100%": percents with an optional bake time
// each, bake where none is given.
func parseStages(s string, bake time.Duration) ([]adminclient.StartStage, error) {
	var out []adminclient.StartStage
	for part := range strings.SplitSeq(s, ",") {
		pct, b, hasBake := strings.Cut(strings.TrimSpace(part), ":")
		p, err := strconv.Atoi(strings.TrimSuffix(pct, "%"))
		if err != nil {
			return nil, fmt.Errorf("--stages: %q is not a percentage such as 5%%", part)
		}
		d := bake
		if hasBake {
			if d, err = time.ParseDuration(b); err != nil {
				return nil, fmt.Errorf("--stages: %q: bake %q is not a duration", part, b)
			}
		}
		out = append(out, adminclient.StartStage{Percent: p, Bake: d.String()})
	}
	return out, nil
}

// readChanges reads a changes file: each document is a policy to put, or
// {delete: NAME}. The server validates the policies.
func readChanges(path string) ([]adminclient.StartChange, error) {
	docs, err := readDocuments(path)
	if err != nil {
		return nil, err
	}
	var out []adminclient.StartChange
	for _, d := range docs {
		var del struct {
			Delete *string `json:"delete"`
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(d.json, &m); err != nil {
			return nil, fmt.Errorf("%s: %s: not an object (nothing was started)", path, d.pos)
		}
		if _, ok := m["delete"]; ok {
			if len(m) != 1 || json.Unmarshal(d.json, &del) != nil || del.Delete == nil || *del.Delete == "" {
				return nil, fmt.Errorf("%s: %s: a delete is {delete: NAME} alone (nothing was started)", path, d.pos)
			}
			out = append(out, adminclient.StartChange{Op: "delete", Name: *del.Delete})
			continue
		}
		out = append(out, adminclient.StartChange{Op: "put", Policy: d.json})
	}
	return out, nil
}

func rolloutStatusCommand(c *adminClient) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "status [ID]",
		Short: "List the active staged rollouts, or show one with its cohort",
		Long: `status without ID lists the active staged rollouts (running, paused, halted).
With ID it shows that rollout, its stages and its current cohort; --wait
follows it until it has completed, rolled back or been aborted, or halted.

Exit codes: 0; 1 with --wait when the rollout halted, rolled back or was
aborted; 2 usage.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			if len(args) == 0 {
				if wait {
					return &usageError{errors.New("--wait needs a rollout ID")}
				}
				list, err := api.StagedRollouts(cmd.Context(), "active")
				if err != nil {
					return err
				}
				return c.print(cmd, list, rolloutTable(list.Rollouts))
			}
			for {
				ro, err := api.StagedRollout(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if !wait || rolloutSettled(ro.State) {
					if err := c.print(cmd, ro, func(w io.Writer) error { return rolloutDetail(w, ro) }); err != nil {
						return err
					}
					if wait && ro.State != "completed" {
						return fmt.Errorf("%w: rollout %s is %s: %s", errRolloutFailed, ro.ID, ro.State, ro.HaltReason)
					}
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(rolloutWaitPoll):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the rollout completes, halts, rolls back or is aborted")
	return cmd
}

// rolloutSettled: nothing moves a rollout in this state without an
// operator.
func rolloutSettled(state string) bool {
	switch state {
	case "completed", "rolled_back", "aborted", "halted":
		return true
	}
	return false
}

func rolloutTable(list []adminclient.StagedRollout) func(io.Writer) error {
	return func(w io.Writer) error {
		tw := newTable(w)
		fmt.Fprintln(tw, "ID\tSTATE\tSTAGE\tPERCENT\tCHANGES\tSTAGE_STARTED\tACTOR")
		for _, ro := range list {
			fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", ro.ID, ro.State, ro.Stage+1, len(ro.Stages), stagePercent(ro),
				changeList(ro.Changes), ro.StageStartedAt.Format(time.RFC3339), ro.Actor)
		}
		return tw.Flush()
	}
}

func stagePercent(ro adminclient.StagedRollout) string {
	if int(ro.Stage) < len(ro.Stages) {
		return fmt.Sprintf("%d%%", ro.Stages[ro.Stage].Percent)
	}
	return "-"
}

func changeList(changes []adminclient.StagedChange) string {
	parts := make([]string, 0, len(changes))
	for _, ch := range changes {
		switch {
		case ch.Op == "delete":
			parts = append(parts, "-"+ch.Name)
		case ch.Policy != nil:
			parts = append(parts, ch.Policy.Name)
		}
	}
	return strings.Join(parts, ",")
}

func rolloutDetail(w io.Writer, ro *adminclient.StagedRollout) error {
	fmt.Fprintf(w, "rollout %s: %s at stage %d of %d (%s) since %s\n", ro.ID, ro.State, ro.Stage+1, len(ro.Stages),
		stagePercent(*ro), ro.StageStartedAt.Format(time.RFC3339))
	fmt.Fprintf(w, "started %s by %s; halt when NACKs > %.2f, pass at ACKs >= %.2f, on halt %s\n",
		ro.CreatedAt.Format(time.RFC3339), ro.Actor, ro.MaxNackRatio, ro.MinAckCoverage, ro.OnHalt)
	if ro.HaltReason != "" {
		fmt.Fprintf(w, "reason: %s\n", ro.HaltReason)
	}
	fmt.Fprintf(w, "changes: %s\n", changeList(ro.Changes))
	if st := ro.Status; st != nil {
		co := st.Cohort
		fmt.Fprintf(w, "cohort: %d discovery sidecars (acked %d, nacked %d, pending %d), %d feed sidecars\n",
			co.Size, co.Acked, co.Nacked, co.Pending, co.SizeWS)
		tw := newTable(w)
		fmt.Fprintln(tw, "STAGE\tPERCENT\tBAKE\tSTATE")
		for i, s := range st.Stages {
			fmt.Fprintf(tw, "%d\t%d%%\t%s\t%s\n", i+1, s.Percent, s.Bake, s.State)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		return printUnreachable(w, st.Unreachable)
	}
	return nil
}
