//go:build !race

package kube

const raceEnabled = false
