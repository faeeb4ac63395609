package command

import "github.com/policyd/policyd/internal/policy"

// IsShadowPut reports whether c is a PutPolicy of a shadow policy
// (command version 4: RolloutVersion).
func IsShadowPut(c *Command) bool {
	return c.Body.GetPutPolicy().GetPolicy().GetEnforcement() == policy.EnforcementShadow
}
