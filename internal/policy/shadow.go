package policy

// Shadow reports whether p is a shadow policy: evaluated, never enforced.
func (p *Policy) Shadow() bool { return p.Enforcement == EnforcementShadow }
