package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/internal/policy"
)

// Policy heads are what a write and a read by name need of a stored policy,
// kept beside it so that neither decodes a 4 KB spec: its kind, scope,
// revision, creation time and source. They are derived from the policies
// bucket, written in the same transaction, and left out of the digest and of what
// nodes compare. A file whose heads were not written up to its applied
// index (one written by a release before them, or a snapshot from such a
// node) has them rebuilt when it is opened or restored.
var (
	bucketPolicyHeads = []byte("policy_heads")
	keyHeadsIndex     = []byte("policy_heads_index")
)

type policyHead struct {
	Kind      string       `json:"kind"`
	Scope     policy.Scope `json:"scope"`
	Revision  uint64       `json:"revision"`
	CreatedAt time.Time    `json:"created_at"`
	Source    string       `json:"source,omitempty"`
}

// putHead records p's head.
func putHead(tx *bolt.Tx, p *policy.Policy) error {
	raw, err := json.Marshal(policyHead{Kind: p.Kind, Scope: p.Scope, Revision: p.Revision, CreatedAt: p.CreatedAt, Source: p.Source})
	if err != nil {
		return fmt.Errorf("encode head of policy %q: %w", p.Name, err)
	}
	return tx.Bucket(bucketPolicyHeads).Put([]byte(p.Name), raw)
}

// getHead reads name's head as a policy holding only the head's fields;
// nil if there is no such policy.
func getHead(tx *bolt.Tx, name string) (*policy.Policy, error) {
	raw := tx.Bucket(bucketPolicyHeads).Get([]byte(name))
	if raw == nil {
		return nil, nil
	}
	var h policyHead
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("decode head of policy %q: %w", name, err)
	}
	return &policy.Policy{Name: name, Kind: h.Kind, Scope: h.Scope, Revision: h.Revision, CreatedAt: h.CreatedAt, Source: h.Source}, nil
}

// syncHeads rebuilds the heads unless they were written up to the applied
// index, and reports whether it did.
func syncHeads(tx *bolt.Tx) (bool, error) {
	meta := tx.Bucket(bucketMeta)
	applied := getUint(meta, keyAppliedIndex)
	if tx.Bucket(bucketPolicyHeads) != nil && getUint(meta, keyHeadsIndex) == applied {
		return false, nil
	}
	if err := tx.DeleteBucket(bucketPolicyHeads); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
		return false, err
	}
	if _, err := tx.CreateBucket(bucketPolicyHeads); err != nil {
		return false, err
	}
	err := tx.Bucket(bucketPolicies).ForEach(func(k, v []byte) error {
		p, _, err := decodePolicy(k, v)
		if err != nil {
			return err
		}
		return putHead(tx, p)
	})
	if err != nil {
		return false, fmt.Errorf("rebuild policy heads: %w", err)
	}
	return true, putUint(meta, keyHeadsIndex, applied)
}

// StoredPolicy returns the named policy's stored JSON, which the read path
// serves as it is, and its revision; ErrNotFound if there is none.
func (s *Store) StoredPolicy(name string) ([]byte, uint64, error) {
	var raw []byte
	var rev uint64
	err := s.view(func(tx *bolt.Tx) error {
		h, err := getHead(tx, name)
		if err != nil {
			return err
		}
		v := tx.Bucket(bucketPolicies).Get([]byte(name))
		if h == nil || v == nil {
			return fmt.Errorf("policy %q: %w", name, ErrNotFound)
		}
		raw, rev = bytes.Clone(v), h.Revision
		return nil
	})
	return raw, rev, err
}
