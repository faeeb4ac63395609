package server

import clusterv1 "github.com/policyd/policyd/api/cluster/v1"

// localShadow is this node's shadow-policy counts of the named policies.
func (n *Node) localShadow(names []string) []*clusterv1.ShadowScopeCount {
	var out []*clusterv1.ShadowScopeCount
	for _, name := range names {
		for _, sc := range n.shadow.Local(name) {
			out = append(out, &clusterv1.ShadowScopeCount{Policy: name, Scope: sc.Scope,
				WouldBlock: sc.WouldBlock, WouldAllow: sc.WouldAllow, Evaluated: sc.Evaluated})
		}
	}
	return out
}
