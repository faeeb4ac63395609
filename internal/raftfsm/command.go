package raftfsm

import (
	"errors"
	"fmt"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

func fromPrecondition(p *commandv1.Precondition) *uint64 {
	if p == nil {
		return nil
	}
	v := p.GetRevision()
	return &v
}

// result turns a business error from the store into an apply response.
func result(index, revision uint64, err error) *commandv1.Result {
	r := &commandv1.Result{Index: index, Revision: revision}
	switch {
	case err == nil:
	case errors.Is(err, store.ErrNotFound):
		r.Code, r.Message = command.CodeNotFound, err.Error()
	case errors.Is(err, store.ErrConflict):
		r.Code, r.Message = command.CodeConflict, err.Error()
	default:
		// Not a business error: the transaction may be half-written. Stop
		// rather than commit it (see ApplyBatch).
		panic(fmt.Sprintf("raftfsm: entry %d: store: %v", index, err))
	}
	return r
}

// storedResult is a put's response: it carries the stored JSON, so that
// the node that took the request can answer with it before it applies the
// entry itself.
func storedResult(index, revision uint64, raw []byte) *commandv1.Result {
	return &commandv1.Result{Index: index, Revision: revision, Value: raw}
}
