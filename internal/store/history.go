package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// History returns the events the log still holds for one policy or
// employee, oldest first, and the highest event ID retention removed. It
// walks the whole log (bounded by retention); ErrNotFound when no event
// names the entity.
func (s *Store) History(typ EntityType, id string) ([]Event, uint64, error) {
	var out []Event
	var pruned uint64
	err := s.view(func(tx *bolt.Tx) error {
		pruned = getUint(tx.Bucket(bucketMeta), keyPrunedThrough)
		// A cheap test on the raw bytes skips most events undecoded; the
		// decoded fields decide.
		needle, err := json.Marshal(id)
		if err != nil {
			return err
		}
		c := tx.Bucket(bucketEvents).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(v) < 8 || !bytes.Contains(v[8:], needle) {
				continue
			}
			var ev Event
			if err := json.Unmarshal(v[8:], &ev); err != nil {
				return fmt.Errorf("decode stored event %d: %w", binary.BigEndian.Uint64(k), err)
			}
			if ev.EntityType == typ && ev.EntityID == id {
				out = append(out, ev)
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	if len(out) == 0 {
		return nil, pruned, fmt.Errorf("%s %q has no events in the log (it never existed, or retention removed them; pruned through %d): %w", typ, id, pruned, ErrNotFound)
	}
	return out, pruned, nil
}
