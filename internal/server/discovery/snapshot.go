package discovery

import (
	"fmt"
	"strconv"
	"sync"

	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/server/policyset"
)

// snapshot is one (scope, version): the response encoded once and shared by
// every stream of the scope.
type snapshot struct {
	version string
	nonce   string
	full    encoded

	unchangedOnce sync.Once
	unchanged     encoded
}

// encoded is a PolicyDiscoveryResponse already in wire form. The codec
// passes it through untouched.
type encoded []byte

func (s *Service) newSnapshot(set *policyset.Set) (*snapshot, error) {
	snap := &snapshot{
		version: set.Version,
		nonce:   s.noncePrefix + "-" + strconv.FormatUint(s.nonceSeq.Add(1), 10),
	}
	resp := &discoveryv1.PolicyDiscoveryResponse{
		VersionInfo: set.Version,
		Nonce:       snap.nonce,
		Policies:    make([]*discoveryv1.Policy, 0, len(set.Policies)),
	}
	for _, rp := range set.Policies {
		p := rp.Policy
		resp.Policies = append(resp.Policies, &discoveryv1.Policy{
			Name:     p.Name,
			Kind:     p.Kind,
			Scope:    &discoveryv1.Scope{Org: p.Scope.Org, Team: p.Scope.Team, Employee: p.Scope.Employee},
			Labels:   p.Labels,
			Spec:     p.Spec,
			Revision: p.Revision,
			// Only clients that declared "shadow" are served a set
			// holding shadow policies (policyset.Set.WithoutShadow).
			Enforcement: p.Enforcement,
		})
	}
	// Deterministic: map keys (labels) in order, so that a policy that did
	// not change has the same bytes in every snapshot, on every node. The
	// SDK decodes only the policies whose bytes it has not seen (client's
	// decodeResponse); a snapshot is encoded once, so the sort is cheap.
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %s: %w", set.Version, err)
	}
	snap.full = b
	return snap, nil
}

// unchangedResponse is the `unchanged` answer for this version, encoded on
// first use.
func (snap *snapshot) unchangedResponse() encoded {
	snap.unchangedOnce.Do(func() {
		b, err := proto.Marshal(&discoveryv1.PolicyDiscoveryResponse{
			VersionInfo: snap.version,
			Nonce:       snap.nonce,
			Unchanged:   true,
		})
		if err != nil {
			// Three scalar fields cannot fail to encode.
			panic(fmt.Sprintf("encode unchanged response: %v", err))
		}
		snap.unchanged = b
	})
	return snap.unchanged
}

// codec is the proto codec, except that an encoded value is sent as is:
// a snapshot is marshalled once, not once per stream.
type codec struct{ encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2(protoenc.Name)} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(encoded); ok {
		// SliceBuffer's Free is a no-op, so gRPC never recycles the shared
		// bytes.
		return mem.BufferSlice{mem.SliceBuffer(e)}, nil
	}
	return c.CodecV2.Marshal(v)
}
