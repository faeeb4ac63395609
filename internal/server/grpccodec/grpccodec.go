// Package grpccodec answers a gRPC request whose strings are not valid
// UTF-8 with InvalidArgument naming the field, instead of grpc-go's
// Internal "failed to unmarshal the received message". Its codec notes the
// bad field (utf8field.Proto) rather than failing the decode, and its
// interceptors fail the call before any handler sees the message; they work
// only together, so ServerOptions installs both. Any other decode error is
// returned as it is. See docs/design.md.
package grpccodec

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/policyd/policyd/internal/utf8field"
)

// Codec wraps a codec (the proto codec, or one built on it) with the UTF-8
// check.
type Codec struct {
	encoding.CodecV2

	// notes counts the entries of bad, so that the calls of a server
	// that never sees invalid UTF-8 (nearly all) take no lock.
	notes atomic.Int64
	mu    sync.Mutex
	// bad holds the note for each message whose decode found invalid
	// UTF-8, until the interceptor of its call takes it (at once, on the
	// same goroutine).
	bad map[any]error
}

// New wraps inner.
func New(inner encoding.CodecV2) *Codec {
	return &Codec{CodecV2: inner, bad: map[any]error{}}
}

// ServerOptions are the options that install c on a server: as its codec,
// whatever content-subtype a client names, and its interceptors, first in
// each chain.
func (c *Codec) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(c.unary),
		grpc.ChainStreamInterceptor(c.stream),
	}
}

// Unmarshal decodes with the wrapped codec; see the package doc for a
// message that is not valid UTF-8.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	buf := data.Materialize()
	bad := utf8field.Proto(m.ProtoReflect().Descriptor(), buf)
	if bad == nil {
		return err
	}
	proto.Reset(m)
	c.mu.Lock()
	c.bad[v] = status.Errorf(codes.InvalidArgument, "invalid request: %v", bad)
	c.notes.Store(int64(len(c.bad)))
	c.mu.Unlock()
	return nil
}

// take returns, and forgets, the note about message v.
func (c *Codec) take(v any) error {
	if c.notes.Load() == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.bad[v]
	delete(c.bad, v)
	c.notes.Store(int64(len(c.bad)))
	return err
}

func (c *Codec) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := c.take(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (c *Codec) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, checkedStream{ServerStream: ss, c: c})
}

// checkedStream fails a RecvMsg whose message the codec found bad.
type checkedStream struct {
	grpc.ServerStream
	c *Codec
}

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.c.take(m)
}
