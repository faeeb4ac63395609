package servertest

import (
	"testing"

	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/store"
)

// RolloutEntity is the change notification the store sends when rollout r
// is written at index, touching the policies of scopes.
func RolloutEntity(t testing.TB, r *commandv1.Rollout, index uint64, scopes ...policy.Scope) store.EntityChange {
	t.Helper()
	data, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return store.EntityChange{Type: store.EntityRollout, ID: r.GetId(), Action: store.ActionUpdate, Index: index, Data: data, Scopes: scopes}
}
