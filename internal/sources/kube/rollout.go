package kube

import (
	"fmt"
	"time"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/sources"
)

// convertRollout is an object's spec.rollout as the engine takes it.
func convertRollout(r *v1alpha1.Rollout) (*sources.Rollout, error) {
	out := &sources.Rollout{
		Stages:       append([]string(nil), r.Stages...),
		MaxNackRatio: r.MaxNackRatio,
		OnHalt:       r.OnHalt,
	}
	if r.Bake != "" {
		d, err := time.ParseDuration(r.Bake)
		if err != nil {
			return nil, policy.ValidationError{{Field: "spec.rollout.bake", Reason: fmt.Sprintf("not a duration: %q", r.Bake)}}
		}
		out.Bake = d
	}
	return out, nil
}
