package console

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"

	"github.com/policyd/policyd/adminclient"
)

// rolloutActions are the actions each active state allows (docs/rollouts.md).
var rolloutActions = map[string][]string{
	"running": {adminclient.RolloutPause, adminclient.RolloutPromote, adminclient.RolloutAbort},
	"paused":  {adminclient.RolloutResume, adminclient.RolloutPromote, adminclient.RolloutAbort},
	"halted":  {adminclient.RolloutResume, adminclient.RolloutPromote, adminclient.RolloutAbort},
}

type rolloutsData struct {
	Rollouts []adminclient.StagedRollout
	State    string
}

func (c *Console) rollouts(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	state := r.URL.Query().Get("state")
	list, err := api.StagedRollouts(r.Context(), state)
	if err != nil {
		return "", "", nil, err
	}
	// Newest first: the one an operator came for is usually the latest.
	slices.Reverse(list.Rollouts)
	return "rollouts", "Rollouts", &rolloutsData{Rollouts: list.Rollouts, State: state}, nil
}

type rolloutData struct {
	Rollout *adminclient.StagedRollout
	Actions []string
}

func (c *Console) rollout(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	ro, err := api.StagedRollout(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", "", nil, err
	}
	d := &rolloutData{Rollout: ro, Actions: rolloutActions[ro.State]}
	return "rollout", "Rollout " + ro.ID, d, nil
}

type rolloutActionData struct {
	Rollout *adminclient.StagedRollout
	Action  string
}

func (c *Console) rolloutConfirm(r *http.Request, _ *session, api *adminclient.Client) (string, string, any, error) {
	action := r.PathValue("action")
	if !validAction(action) {
		return "", "", nil, fmt.Errorf("%w: no rollout action %q", errNotFound, action)
	}
	ro, err := api.StagedRollout(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", "", nil, err
	}
	return "rollout_action", action + " rollout " + ro.ID, &rolloutActionData{Rollout: ro, Action: action}, nil
}

func (c *Console) rolloutAction(r *http.Request, s *session, api *adminclient.Client) (string, error) {
	id, action := r.PathValue("id"), r.PathValue("action")
	if !validAction(action) {
		return "", fmt.Errorf("%w: no rollout action %q", errNotFound, action)
	}
	ro, err := api.RolloutAction(r.Context(), id, action)
	if err != nil {
		return "", err
	}
	return "/ui/rollouts/" + url.PathEscape(id) + "?" + s.flash(fmt.Sprintf("%s: the rollout is %s.", action, ro.State)), nil
}

func validAction(a string) bool {
	switch a {
	case adminclient.RolloutPause, adminclient.RolloutResume, adminclient.RolloutPromote, adminclient.RolloutAbort:
		return true
	}
	return false
}
