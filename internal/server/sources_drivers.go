package server

import "github.com/policyd/policyd/internal/sources"

// sourceDrivers builds a driver per configured source.
func (n *Node) sourceDrivers() ([]sources.Driver, error) {
	return nil, nil
}
