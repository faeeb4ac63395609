package main

import (
	"slices"
	"testing"
	"time"
)

func TestAssetRefs(t *testing.T) {
	html := []byte(`<link rel="stylesheet" href="/ui/assets/console.css">
<link rel="icon" href="/ui/assets/favicon.svg?v=2"><a href="/ui/policies">x</a>
<script src="/ui/assets/console.js" defer></script><script src="/ui/assets/console.js"></script>
<img src="/elsewhere/x.png">`)
	got := assetRefs(html)
	want := []string{"/ui/assets/console.css", "/ui/assets/favicon.svg", "/ui/assets/console.js"}
	if !slices.Equal(got, want) {
		t.Errorf("assetRefs = %q, want %q", got, want)
	}
	if got := assetRefs([]byte("<p>no assets</p>")); len(got) != 0 {
		t.Errorf("assetRefs of a page without assets = %q", got)
	}
}

func TestCPUShare(t *testing.T) {
	for _, tc := range []struct {
		used, wall time.Duration
		want       float64
	}{
		{3 * time.Second, 30 * time.Second, 10},
		{45 * time.Second, 30 * time.Second, 150}, // two cores busy
		{time.Second, 0, 0},
	} {
		if got := cpuShare(tc.used, tc.wall); got != tc.want {
			t.Errorf("cpuShare(%v, %v) = %g, want %g", tc.used, tc.wall, got, tc.want)
		}
	}
}
