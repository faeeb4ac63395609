package feedv1

// ShadowReport is a client's counts of the shadow policies it evaluated
// since its previous report.
type ShadowReport struct {
	Type   string        `json:"type"` // TypeShadowReport
	Counts []ShadowCount `json:"counts"`
}

// ShadowCount is one shadow policy's counts: decisions where it would have
// denied while the enforced policies allowed (would_block), the reverse
// (would_allow), and how often it was evaluated.
type ShadowCount struct {
	Policy     string `json:"policy"`
	WouldBlock uint64 `json:"would_block"`
	WouldAllow uint64 `json:"would_allow"`
	Evaluated  uint64 `json:"evaluated"`
}
