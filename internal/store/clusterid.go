package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// EntityCluster is the change notified when the cluster ID is set.
const EntityCluster EntityType = "cluster"

var keyClusterID = []byte("cluster_id")

// ClusterID is the cluster this state belongs to, "" until the first
// leader has named it.
func (s *Store) ClusterID() (string, error) {
	var id string
	err := s.view(func(tx *bolt.Tx) error {
		id = string(tx.Bucket(bucketMeta).Get(keyClusterID))
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read cluster ID from %q: %w", s.path, err)
	}
	return id, nil
}

// SetClusterID names the cluster. The first ID applied wins: a later one
// (two leaders that both found none, or a replayed entry) changes nothing,
// so every replica keeps the same ID.
func (b *Batch) SetClusterID(m Meta, id string) error {
	meta := b.tx.Bucket(bucketMeta)
	if meta.Get(keyClusterID) != nil {
		return nil
	}
	if err := meta.Put(keyClusterID, []byte(id)); err != nil {
		return fmt.Errorf("set cluster ID: %w", err)
	}
	b.changes = append(b.changes, EntityChange{Type: EntityCluster, ID: id, Action: ActionCreate, Index: m.Index})
	return nil
}
