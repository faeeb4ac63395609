package main

import (
	"context"
	"fmt"

	"github.com/policyd/policyd/adminclient"
)

// startConsoleRollout starts a staged rollout that stays in its first
// stage for the run, so that the rollout pages have one to show.
func startConsoleRollout(ctx context.Context, api *adminclient.Client, size int) (string, error) {
	name := propPolicyName(0, 1)
	ro, err := api.StartRollout(ctx, adminclient.StartRollout{
		Changes:      []adminclient.StartChange{{Op: "put", Policy: propPolicyBody(name, orgName(0), 1000, size)}},
		Stages:       []adminclient.StartStage{{Percent: 10, Bake: "1h"}, {Percent: 100, Bake: "1h"}},
		MaxNackRatio: 1,
		OnHalt:       "stay",
	})
	if err != nil {
		return "", fmt.Errorf("POST /v1/rollouts: %w", err)
	}
	return ro.ID, nil
}
