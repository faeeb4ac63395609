package policy

import (
	"fmt"
	"strings"
	"testing"
)

// TestPlainRun checks the word-at-a-time test against the plain one for
// every byte value at every position of the word and of the tail.
func TestPlainRun(t *testing.T) {
	plain := func(c byte) bool { return c >= 0x20 && c < 0x7f && c != '\\' }
	for _, n := range []int{1, 8, 9, 17} {
		t.Run(fmt.Sprintf("len=%d", n), func(t *testing.T) {
			for pos := range n {
				for c := range 256 {
					s := []byte(strings.Repeat("a", n))
					s[pos] = byte(c)
					if got, want := plainRun(s), plain(byte(c)); got != want {
						t.Fatalf("plainRun(%q) = %v, want %v", s, got, want)
					}
				}
			}
		})
	}
}
