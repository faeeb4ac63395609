package decisionlog

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"

	decisionsv1 "github.com/policyd/policyd/api/decisions/v1"
)

// Masker hides identities from read tokens (decisions.mask_identities): an
// employee or client address becomes a keyed hash, the same within one
// node's lifetime so that a page's rows can still be told apart, but not a
// dictionary away from the name as a plain hash would be.
type Masker struct{ key []byte }

// NewMasker draws a fresh key.
func NewMasker() *Masker {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // crypto/rand.Read never fails
	return &Masker{key: k}
}

// Mask replaces r's employee and client address.
func (m *Masker) Mask(r *decisionsv1.Record) {
	r.Employee = m.hash(r.Employee)
	r.ClientAddress = m.hash(r.ClientAddress)
}

func (m *Masker) hash(s string) string {
	if s == "" {
		return ""
	}
	h := hmac.New(sha256.New, m.key)
	h.Write([]byte(s))
	return "masked:" + hex.EncodeToString(h.Sum(nil)[:8])
}
